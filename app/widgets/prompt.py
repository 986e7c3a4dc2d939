"""The prompt: a TextArea where Enter sends, Shift+Enter / Ctrl+J break the line, large pastes detach."""

from __future__ import annotations

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import TextArea

from parley.app.paste_budget import normalise_newlines

LARGE_PASTE_LINES = 20
LARGE_PASTE_CHARS = 1000


def is_large_paste(text: str) -> bool:
    return text.count("\n") + 1 > LARGE_PASTE_LINES or len(text) > LARGE_PASTE_CHARS


class PromptInput(TextArea):
    """Multi-line input. Posts `Submitted` on Enter and `LargePaste` instead of inserting a document."""

    BINDINGS = [
        Binding("enter", "submit", "Send", priority=False, tooltip="Send the message"),
        Binding("shift+enter,ctrl+j", "newline", "Newline", show=False, tooltip="New line"),
        Binding("ctrl+s", "summarise", "Summarise", tooltip="Summarise the pasted document"),
    ]

    # Set by the app while a pasted document waits to be sent: shows the Summarise key in the footer.
    has_attachment: reactive[bool] = reactive(False, bindings=True)

    class Submitted(Message):
        def __init__(self, prompt: PromptInput, text: str) -> None:
            super().__init__()
            self.prompt = prompt
            self.text = text

    class LargePaste(Message):
        """A paste big enough to become an attachment rather than text in the input."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    class EditLast(Message):
        """Up in an empty prompt: the user wants their last message back."""

    class Summarise(Message):
        """The one-key 'summarise the pasted document' action."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, soft_wrap=True, show_line_numbers=False, tab_behavior="focus",
                         placeholder="Message Parley…  (Enter sends, Ctrl+J new line, paste a document)")

    async def _on_key(self, event: events.Key) -> None:
        # TextArea inserts a newline on Enter in its own _on_key; we take Enter first.
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.action_submit()
        elif event.key in ("shift+enter", "ctrl+j"):
            # Here rather than only as a binding: a binding's action runs after the keys already queued,
            # so in a fast burst the newline would land after the words typed behind it.
            event.stop()
            event.prevent_default()
            self.action_newline()
        elif event.key == "up" and not self.text and self.cursor_location == (0, 0):
            event.stop()
            event.prevent_default()
            self.post_message(self.EditLast())

    async def _on_paste(self, event: events.Paste) -> None:
        # Stop TextArea's own handler (later in the MRO): we insert the text with LF line endings.
        event.stop()
        event.prevent_default()
        text = normalise_newlines(event.text)
        if is_large_paste(text):
            self.post_message(self.LargePaste(text))
        elif not self.read_only and (result := self._replace_via_keyboard(text, *self.selection)):
            self.move_cursor(result.end_location)
            self.focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "summarise":
            return self.has_attachment
        return True

    def action_submit(self) -> None:
        self.post_message(self.Submitted(self, self.text))

    def action_newline(self) -> None:
        self.insert("\n")

    def action_summarise(self) -> None:
        self.post_message(self.Summarise())
