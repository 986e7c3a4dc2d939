"""The first-run choice for a .gguf whose weights already are 4-bit: keep them, or make Parley's INT4."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static


class WeightsChoiceScreen(ModalScreen[str]):
    """Dismisses with "gguf" (the file's own weights, nothing quantized) or "awq" (Parley's INT4, made in the
    background while the chat runs on the file's weights, then switched to between replies)."""

    BINDINGS = [Binding("escape", "choose('gguf')", "Keep the file's weights"),
                Binding("k", "choose('gguf')", "Keep"), Binding("m", "choose('awq')", "Make Parley's INT4")]

    def __init__(self, model: str, weights: str) -> None:
        super().__init__()
        self.model, self.weights = model, weights

    def compose(self) -> ComposeResult:
        with Vertical(id="weights-choice-box", classes="dialog"):
            yield Label(f"{self.model} is already 4-bit ({self.weights})", classes="dialog--title")
            yield Static(f"Running the file's own {self.weights} weights now, on Parley's INT4 kernels: nothing "
                         "to quantize. Parley can also make its own INT4 of this model (AWQ, a few minutes in the "
                         "background; the chat goes on meanwhile and switches when it is ready). Parley remembers "
                         "the choice for this model.", id="weights-choice-message")
            with Horizontal(classes="dialog--buttons"):
                yield Button(f"Keep the file's {self.weights} (k)", variant="primary", id="gguf")
                yield Button("Make Parley's INT4 (m)", id="awq")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(str(event.button.id))

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice)
