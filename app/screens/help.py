"""Keys at a glance, generated from the bindings. The footer shows the ones in reach; this shows all."""

from __future__ import annotations

from collections.abc import Iterable

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from parley.app.commands import key_label


def key_rows(bindings: Iterable[Binding]) -> list[tuple[str, str]]:
    """(keys, what they do) for each action whose binding has a tooltip; keys of one action together."""
    rows: dict[str, tuple[list[str], str]] = {}
    for b in bindings:
        if b.tooltip:
            keys, _ = rows.setdefault(b.action, ([], b.tooltip))
            label = b.key_display or key_label(b)
            if label not in keys:
                keys.append(label)
    return [(", ".join(keys), does) for keys, does in rows.values()]


def help_table(sections: Iterable[tuple[str, Iterable[Binding]]]) -> Table:
    """One block per (title, bindings), keys on the left, what they do on the right (wrapping there)."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    table.add_row(Text.assemble(("Parley keys", "bold")), "")
    for title, bindings in sections:
        rows = key_rows(bindings)
        if rows:
            table.add_row("", "")
            table.add_row(Text.assemble((title, "bold underline")), "")
            for keys, does in rows:
                table.add_row(keys, does)
    table.add_row("", "")
    table.add_row("Ctrl+P", "command palette")
    table.add_row("Ctrl+Q", "quit")
    table.add_row("", "")
    table.add_row("", Text("A paste over 20 lines or 1,000 characters becomes an attachment.", "italic"))
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def __init__(self, sections: Iterable[tuple[str, Iterable[Binding]]]) -> None:
        super().__init__()
        self.sections = [(title, list(bindings)) for title, bindings in sections]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Static(help_table(self.sections))
