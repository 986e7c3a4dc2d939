"""The app's actions in Textual's command palette (Ctrl+P)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

# (title, help, action name on the app)
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("New chat", "Start a new conversation", "new_chat"),
    ("Regenerate last reply", "Ask again for the last answer", "regenerate"),
    ("Edit last message", "Put your last message back in the prompt", "edit_last"),
    ("Stop generation", "Stop the reply now, keeping what was shown", "stop"),
    ("Toggle sampling panel", "Temperature, top-p, top-k, min-p, speculation…", "toggle_params"),
    ("History", "Resume, rename, delete or export conversations", "history"),
    ("Edit system prompt", "The system prompt of this conversation", "system_prompt"),
    ("Export conversation as Markdown", "Write this conversation to a .md file", "export"),
    ("Copy last reply", "Copy the last reply to the clipboard (OSC 52)", "copy_reply"),
    ("Copy last code block", "Copy the last code block of the last reply", "copy_code"),
    ("Summarise pasted document", "Send the attachment with a request to summarise it", "summarise"),
    ("Keys", "Show the help screen", "help"),
)


class ParleyCommands(Provider):
    """Each command runs the app action of the same name, so keys and palette do the same thing."""

    def _callback(self, action: str) -> Callable[[], object]:
        return partial(self.app.run_action, action)

    async def discover(self) -> Hits:
        for title, help_text, action in COMMANDS:
            yield DiscoveryHit(title, self._callback(action), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, action in COMMANDS:
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), self._callback(action), help=help_text)
