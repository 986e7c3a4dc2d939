"""The compact chip a large paste turns into, above the prompt."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Button, Label

from parley.app.widgets.message import attachment_label


class Attachment(Horizontal):
    """Shows 'pasted: N lines, T tokens' (or the file's name) for the document going with the next message."""

    class Removed(Message):
        pass

    def __init__(self, text: str, *, name: str | None = None, id: str | None = None) -> None:
        super().__init__(id=id)
        self.text = text
        self.file_name = name  # the file it came from, when opened rather than pasted
        self.tokens: int | None = None

    def compose(self) -> ComposeResult:
        yield Label(attachment_label(self.text, None, name=self.file_name), id="attachment-label", markup=False)
        yield Label("Ctrl+S summarise", id="attachment-hint")
        yield Button("✕", id="attachment-remove", compact=True, tooltip="Remove the pasted document")

    def set_tokens(self, tokens: int) -> None:
        self.tokens = tokens
        self.query_one("#attachment-label", Label).update(attachment_label(self.text, tokens, name=self.file_name))

    def replace_text(self, text: str, tokens: int) -> None:
        self.text = text
        self.set_tokens(tokens)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.post_message(self.Removed())
