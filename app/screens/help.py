"""Keys at a glance, generated from the bindings. The footer shows the ones in reach; this shows all."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from parley.app.commands import key_label


def help_text(sections: Iterable[tuple[str, Iterable[Binding]]]) -> Text:
    """One block per (title, bindings); a binding is listed when its tooltip says what it does."""
    rows = [(title, [(b.key_display or key_label(b), b.tooltip) for b in bindings if b.tooltip])
            for title, bindings in sections]
    width = max((len(k) for _, keys in rows for k, _ in keys), default=0) + 2
    text = Text()
    text.append("Parley keys\n", "bold")
    for title, keys in rows:
        if not keys:
            continue
        text.append(f"\n{title}\n", "bold underline")
        for key, does in keys:
            text.append(key.ljust(width), "bold")
            text.append(does + "\n")
    text.append("\nCtrl+P opens the command palette; Ctrl+Q quits.\n")
    text.append("A paste over 20 lines or 1,000 characters becomes an attachment.", "italic")
    return text


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def __init__(self, sections: Iterable[tuple[str, Iterable[Binding]]]) -> None:
        super().__init__()
        self.sections = [(title, list(bindings)) for title, bindings in sections]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Static(help_text(self.sections))
