"""Pasted and opened documents: the chip above the prompt, its token count, and what to do when it is too long.

A document rides with the next message. Counting its tokens needs the engine, so it runs on a worker
thread and the result is marshalled back; a document too long for the context asks before truncating.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from parley.app import paste_budget
from parley.app.screens.dialogs import OpenFileScreen, TooLongScreen
from parley.app.widgets.attachment import Attachment

if TYPE_CHECKING:
    from parley.app.chat_app import ParleyApp

SUMMARISE_PROMPT = "Summarise the pasted document: the main points as a short bulleted list."
MAX_FILE_BYTES = 4_000_000


class AttachmentController:
    """Owns the document waiting to be sent, if any: attach, measure, replace, remove."""

    def __init__(self, app: ParleyApp) -> None:
        self.app = app

    def open_file(self) -> None:
        """Ask for a path, then attach that file."""
        async def chosen(path: str | None) -> None:
            if path:
                await self.attach_file(Path(path).expanduser())

        self.app.push_screen(OpenFileScreen(), chosen)

    async def attach_file(self, path: Path) -> None:
        """Attach a text file as the document sent with the next message (llama-cli's /read)."""
        app = self.app
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                app.notify(f"{path} is over {MAX_FILE_BYTES // 1_000_000} MB: attach a smaller file",
                           severity="error", markup=False)
                return
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            app.notify(f"{path} is not UTF-8 text", severity="error", markup=False)
            return
        except OSError as e:
            app.notify(f"Could not read {path}: {e.strerror or e}", severity="error", markup=False)
            return
        await self.attach_text(paste_budget.normalise_newlines(text), name=path.name)
        app.prompt.focus()

    async def summarise(self) -> None:
        """Send the canned summary request with the document; without one, say how to get one."""
        if self.app.attachment is None:
            self.app.notify("Paste a document first, then Ctrl+S summarises it")
            return
        await self.app.conversations.send(SUMMARISE_PROMPT)

    async def remove(self) -> None:
        if (chip := self.app.attachment) is not None:
            await chip.remove()
        self.app.prompt.has_attachment = False

    async def dismiss(self) -> None:
        """The chip's own remove: drop the document and go back to typing."""
        await self.remove()
        self.app.prompt.focus()

    async def attach_text(self, text: str, tokens: int | None = None, name: str | None = None) -> None:
        """Show `text` as the document; count it unless `tokens` is known (or the engine is still loading)."""
        app = self.app
        if app.attachment is not None:
            await self.remove()
            app.notify("The new document replaces the previous one")
        chip = Attachment(text, name=name, id="attachment")
        await app.screen_stack[0].query_one("#composer").mount(chip, before=app.prompt)
        app.prompt.has_attachment = True
        if tokens is not None:
            chip.set_tokens(tokens)
        elif app.engine is not None:
            self.count(text)

    def count(self, text: str) -> None:
        """Measure `text` against what the conversation already takes, off the UI thread."""
        app = self.app
        conversation, max_new_tokens = app.conversations.texts(), app.params.max_new_tokens
        app.run_worker(lambda: self._measure(text, conversation, max_new_tokens), name="measure_attachment",
                       group="count", exclusive=True, thread=True, exit_on_error=False)

    def _measure(self, text: str, conversation: list[str], max_new_tokens: int) -> None:
        """Count tokens (and the fitting prefix, if it is too long) off the UI thread."""
        app = self.app
        engine = app.engine
        assert engine is not None
        used = sum(engine.count_tokens(t) for t in conversation)
        tokens = engine.count_tokens(text)
        b = paste_budget.budget(engine.context_window, used, len(conversation), max_new_tokens)
        if tokens <= b.free:
            app.call_from_thread(self._counted, text, tokens)
            return
        kept, kept_tokens = paste_budget.fit_text(engine.count_tokens, text, b.free)
        message = paste_budget.too_long_message(tokens, b, text, kept, kept_tokens)
        app.call_from_thread(self._too_long, text, message, kept, kept_tokens)

    def _counted(self, text: str, tokens: int) -> None:
        chip = self.app.attachment
        if chip is not None and chip.text == text:  # not replaced or removed while it was counted
            chip.set_tokens(tokens)

    def _too_long(self, text: str, message: str, kept: str, kept_tokens: int) -> None:
        app = self.app

        async def decided(truncate: bool | None) -> None:
            chip = app.attachment
            if chip is None or chip.text != text:
                return
            if truncate and kept:
                chip.replace_text(kept, kept_tokens)
                app.notify(f"Pasted document truncated to {kept_tokens:,} tokens")
            else:
                await self.remove()
                app.notify("Paste cancelled")
            app.prompt.focus()

        app.push_screen(TooLongScreen(message), decided)
