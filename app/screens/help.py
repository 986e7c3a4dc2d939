"""Keys at a glance. The footer shows the ones in reach; this shows all of them."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = (
    ("Enter", "send"),
    ("Shift+Enter, Ctrl+J", "new line"),
    ("Esc", "stop the reply (keeps what was shown)"),
    ("Ctrl+R", "regenerate the last reply"),
    ("Ctrl+G, ↑ (empty prompt)", "edit and resend your last message"),
    ("Ctrl+N", "new chat"),
    ("F2", "sampling sliders: ←/→, Home/End, mouse"),
    ("F3 / F4", "history / system prompt"),
    ("Ctrl+S", "summarise the pasted document"),
    ("c / y on a message", "copy it / copy its code block"),
    ("Tab", "move between prompt, messages, panel"),
    ("Ctrl+P", "command palette (themes, export…)"),
    ("Ctrl+Q", "quit"),
)


def help_text() -> Text:
    text = Text()
    text.append("Parley keys\n\n", "bold")
    width = max(len(k) for k, _ in KEYS) + 2
    for key, does in KEYS:
        text.append(key.ljust(width), "bold")
        text.append(does + "\n")
    text.append("\nA paste over 20 lines or 1,000 characters becomes an attachment.", "italic")
    return text


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Static(help_text())
