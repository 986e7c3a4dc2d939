"""A screen's actions in Textual's command palette (Ctrl+P), generated from the screen's bindings.

A binding's `tooltip` is the command's title and its key the help line, so keys, palette and help
screen never disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider


def key_label(binding: Binding) -> str:
    """'Ctrl+R' for 'ctrl+r', 'F2' for 'f2', 'Esc' for 'escape'; several keys joined with ', '."""
    names = {"escape": "Esc", "enter": "Enter", "up": "↑", "down": "↓"}
    return ", ".join(names.get(k, "+".join(p.upper() if len(p) <= 3 and p[0] == "f" else p.capitalize()
                                          for p in k.split("+")))
                     for k in binding.key.split(","))


def palette_entries(bindings: Iterable[Binding]) -> list[tuple[str, str, str]]:
    """(title, help, action) for each binding that says what it does."""
    return [(b.tooltip, f"key: {b.key_display or key_label(b)}", b.action) for b in bindings if b.tooltip]


class ParleyCommands(Provider):
    """The keys of the screen the palette was opened from, then the app's: each command runs the action on
    the node whose binding it is, so keys and palette do the same thing."""

    def _entries(self) -> list[tuple[str, str, Callable[[], object]]]:
        return [(title, help_text, partial(self.app.run_action, action, node))
                for node in (self.screen, self.app)
                for title, help_text, action in palette_entries(Binding.make_bindings(type(node).BINDINGS))]

    async def discover(self) -> Hits:
        for title, help_text, run in self._entries():
            yield DiscoveryHit(title, run, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, run in self._entries():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), run, help=help_text)
