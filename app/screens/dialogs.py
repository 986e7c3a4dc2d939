"""Small modal dialogs: the per-conversation system prompt, and a paste too long for the context."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, TextArea


class SystemPromptScreen(ModalScreen[str | None]):
    """Edit the system prompt of this conversation. Dismisses with the new text, or None to cancel;
    `as_default` says the user also wants it for new conversations (kept across restarts)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save"),
                Binding("ctrl+d", "save(True)", "Save as default")]

    def __init__(self, system_prompt: str) -> None:
        super().__init__()
        self.system_prompt = system_prompt
        self.as_default = False

    def compose(self) -> ComposeResult:
        with Vertical(id="system-box", classes="dialog"):
            yield Label("System prompt for this conversation (Ctrl+S saves, Esc cancels)")
            yield TextArea(self.system_prompt, id="system-text", soft_wrap=True)
            with Horizontal(classes="dialog--buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Save as default", id="save-default", tooltip="Also for new chats (Ctrl+D)")
                yield Button("Cancel", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id in ("save", "save-default"):
            self.action_save(event.button.id == "save-default")
        else:
            self.action_cancel()

    def action_save(self, as_default: bool = False) -> None:
        self.as_default = as_default
        self.dismiss(self.query_one("#system-text", TextArea).text.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)


class TooLongScreen(ModalScreen[bool]):
    """A paste that does not fit the context: say how much fits, let the user truncate or cancel."""

    BINDINGS = [Binding("escape", "choose(False)", "Cancel"), Binding("t", "choose(True)", "Truncate")]

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def compose(self) -> ComposeResult:
        with Vertical(id="too-long-box", classes="dialog"):
            yield Label("The pasted document does not fit", classes="dialog--title")
            yield Static(self.message, id="too-long-message")
            with Horizontal(classes="dialog--buttons"):
                yield Button("Truncate to fit", variant="warning", id="truncate")
                yield Button("Cancel paste", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "truncate")

    def action_choose(self, truncate: bool) -> None:
        self.dismiss(truncate)


class OpenFileScreen(ModalScreen[str | None]):
    """Ask for a path to attach (llama-cli's /read). Dismisses with the path typed, or None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def compose(self) -> ComposeResult:
        with Vertical(id="open-file-box", classes="dialog"):
            yield Label("Attach a text file: its path (Enter attaches, Esc cancels)")
            yield Input(placeholder="~/notes/report.md", id="open-file-path")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class DocumentWontFitScreen(ModalScreen[str | None]):
    """The next reply would leave out a document: say so before sending, and let the user choose. Dismisses
    with "shorten" (a shorter reply that keeps it), "leave" (send without it) or None (edit the question)."""

    BINDINGS = [Binding("escape", "choose(None)", "Edit the question"), Binding("s", "choose('shorten')", "Shorten"),
                Binding("l", "choose('leave')", "Leave it out")]

    def __init__(self, message: str, room: int | None) -> None:
        super().__init__()
        self.message = message
        self.room = room  # the reply length that keeps the documents; None when none does

    def compose(self) -> ComposeResult:
        with Vertical(id="wont-fit-box", classes="dialog"):
            yield Label("The document no longer fits with this question", classes="dialog--title")
            yield Static(self.message, id="wont-fit-message", markup=False)
            with Horizontal(classes="dialog--buttons"):
                if self.room is not None:
                    yield Button(f"Keep it: a reply of up to {self.room:,} tokens (S)", variant="primary",
                                 id="shorten")
                yield Button("Send without it (L)", variant="warning", id="leave")
                yield Button("Edit the question (Esc)", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None if event.button.id == "cancel" else event.button.id)

    def action_choose(self, choice: str | None) -> None:
        if choice != "shorten" or self.room is not None:
            self.dismiss(choice)
