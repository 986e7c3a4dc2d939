"""Keys at a glance. The footer shows the ones in reach; this shows all of them."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# Parley keys

| Key | Does |
|---|---|
| Enter / Shift+Enter, Ctrl+J | send / new line |
| Esc | stop the reply (keeps what was shown) |
| Ctrl+R / Ctrl+G, ↑ | regenerate / edit & resend last |
| Ctrl+N | new chat |
| F2 | sampling sliders (←/→, Home/End, mouse) |
| F3 / F4 | history / system prompt |
| Ctrl+S | summarise the pasted document |
| c / y on a message | copy it / copy its code |
| Ctrl+P / Ctrl+Q | command palette / quit |

A paste over 20 lines or 1,000 characters becomes an attachment.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Markdown(HELP)
