"""Switch models without restarting: the models this machine has (quantized in the cache, or used lately),
or any hub id, directory or .gguf typed in. The conversation carries over (the new model reads it afresh)."""

from __future__ import annotations

import json
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

RECENT_KEY = "recent_models"  # settings: the models switched to lately, newest first
RECENT_KEPT = 8


def cached_models(root: Path | None = None) -> list[str]:
    """The models with a complete INT4 build in the cache (their manifest is written last)."""
    if root is None:
        from parley.models.quantize.cache import awq_root

        root = awq_root()
    found = []
    for manifest in sorted(root.glob("*/manifest.json")) if root.is_dir() else []:
        try:
            source = json.loads(manifest.read_text())["source"]
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            continue  # a damaged or foreign folder: not offered
        if not isinstance(source, dict):
            continue
        ref = source.get("repo_id") or source.get("path") or source.get("ref")
        if isinstance(ref, str) and ref not in found:
            found.append(ref)
    return found


def remember(recent: object, ref: str) -> list[str]:
    """`recent` (as read from the settings) with `ref` first."""
    kept = [r for r in recent if isinstance(r, str) and r != ref] if isinstance(recent, list) else []
    return [ref, *kept][:RECENT_KEPT]


class ModelPickerScreen(ModalScreen[str | None]):
    """Pick a model from the list or type one; dismisses with its reference, or None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("down", "to_list", "The list", show=False)]
    AUTO_FOCUS = "#model-ref"  # a typed path goes where it is typed; Down reaches the list

    def __init__(self, current: str, recent: list[str], cached: list[str]) -> None:
        super().__init__()
        self.current = current
        self.choices: list[tuple[str, str]] = []  # (reference, where it comes from)
        for ref in recent:
            self.choices.append((ref, "used lately"))
        for ref in cached:
            if ref not in recent:
                self.choices.append((ref, "quantized, in the cache"))

    def compose(self) -> ComposeResult:
        with Vertical(id="model-box", classes="dialog"):
            yield Label(f"Switch model (now: {self.current}); the conversation carries over",
                        classes="dialog--title", markup=False)
            if self.choices:
                yield OptionList(*(Option(f"{ref}  ({where})", id=str(i))
                                   for i, (ref, where) in enumerate(self.choices)), id="model-list")
            else:
                yield Label("No other model on this machine yet: type one below.", markup=False)
            yield Input(placeholder="hub id (org/name), folder or .gguf file; Enter switches", id="model-ref")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.choices[int(event.option.id or 0)][0])

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_to_list(self) -> None:
        if self.focused is self.query_one("#model-ref") and self.query("#model-list"):
            self.query_one("#model-list").focus()

    def action_cancel(self) -> None:
        self.dismiss(None)
