"""Pasted and opened documents: the chip above the prompt, its token count, and what to do when it is too long.

A document rides with the next message. Counting its tokens needs the engine, so it runs on a worker
thread and the result is marshalled back; a document too long for the context asks before truncating.
"""

from __future__ import annotations

from pathlib import Path

from textual.app import App
from textual.screen import Screen
from textual.widget import Widget

from parley.app import paste_budget
from parley.app.engine_lifecycle import EngineLifecycle
from parley.app.screens.dialogs import OpenFileScreen, TooLongScreen
from parley.app.store import compose_user_content
from parley.app.widgets.attachment import Attachment
from parley.app.widgets.message import ChatView
from parley.app.widgets.prompt import PromptInput
from parley.engine.params import GenerationParams

SUMMARISE_PROMPT = "Summarise the pasted document: the main points as a short bulleted list."
MAX_FILE_BYTES = 4_000_000


class AttachmentController:
    """Owns the document waiting to be sent, if any: attach, measure, replace, remove.

    The chip lives in the composer, above the prompt, both given at mount."""

    def __init__(self, engines: EngineLifecycle, params: GenerationParams) -> None:
        self.engines = engines  # counting tokens needs the engine in use
        self.params = params
        self.screen: Screen
        self.chat: ChatView
        self.composer: Widget
        self.prompt: PromptInput

    def mount(self, screen: Screen, chat: ChatView, composer: Widget, prompt: PromptInput) -> None:
        self.screen, self.chat, self.composer, self.prompt = screen, chat, composer, prompt

    @property
    def ui(self) -> App:
        """Textual's services that only the App has: pushing screens, calls from other threads."""
        return self.screen.app

    @property
    def chip(self) -> Attachment | None:
        found = self.composer.query(Attachment)
        return found.first() if found else None

    def open_file(self) -> None:
        """Ask for a path, then attach that file."""
        async def chosen(path: str | None) -> None:
            if path:
                await self.attach_file(Path(path).expanduser())

        self.ui.push_screen(OpenFileScreen(), chosen)

    async def attach_file(self, path: Path) -> None:
        """Attach a text file as the document sent with the next message (llama-cli's /read)."""
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                self.prompt.notify(f"{path} is over {MAX_FILE_BYTES // 1_000_000} MB: attach a smaller file",
                                   severity="error", markup=False)
                return
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            self.prompt.notify(f"{path} is not UTF-8 text", severity="error", markup=False)
            return
        except OSError as e:
            self.prompt.notify(f"Could not read {path}: {e.strerror or e}", severity="error", markup=False)
            return
        await self.attach_text(paste_budget.normalise_newlines(text), name=path.name)
        self.prompt.focus()

    def summarise(self) -> None:
        """Send the canned summary request with the document (as if typed); without one, say how to get one."""
        if self.chip is None:
            self.prompt.notify("Paste a document first, then Ctrl+S summarises it")
            return
        self.screen.post_message(PromptInput.Submitted(self.prompt, SUMMARISE_PROMPT))

    async def remove(self) -> None:
        if (chip := self.chip) is not None:
            await chip.remove()
        self.prompt.has_attachment = False

    async def dismiss(self) -> None:
        """The chip's own remove: drop the document and go back to typing."""
        await self.remove()
        self.prompt.focus()

    async def attach_text(self, text: str, tokens: int | None = None, name: str | None = None) -> None:
        """Show `text` as the document; count it unless `tokens` is known (or the engine is still loading)."""
        if self.chip is not None:
            await self.remove()
            self.prompt.notify("The new document replaces the previous one")
        chip = Attachment(text, name=name, id="attachment")
        await self.composer.mount(chip, before=self.prompt)
        self.prompt.has_attachment = True
        if tokens is not None:
            chip.set_tokens(tokens)
        elif self.engines.engine is not None:
            self.count(text)

    def count_waiting(self) -> None:
        """An engine is in: measure a document attached while none was."""
        chip = self.chip
        if chip is not None and chip.tokens is None:
            self.count(chip.text)

    def count(self, text: str) -> None:
        """Measure `text` against what the conversation already takes, off the UI thread."""
        conversation = [compose_user_content(m.content, m.attachment) for m in self.chat.messages]
        max_new_tokens, ui = self.params.max_new_tokens, self.ui  # a widget finds its app on the UI thread only
        self.composer.run_worker(lambda: self._measure(ui, text, conversation, max_new_tokens),
                                 name="measure_attachment", group="count", exclusive=True, thread=True,
                                 exit_on_error=False)

    def _measure(self, ui: App, text: str, conversation: list[str], max_new_tokens: int) -> None:
        """Count tokens (and the fitting prefix, if it is too long) off the UI thread."""
        engine = self.engines.engine
        assert engine is not None
        used = sum(engine.count_tokens(t) for t in conversation)
        tokens = engine.count_tokens(text)
        b = paste_budget.budget(engine.context_window, used, len(conversation), max_new_tokens)
        if tokens <= b.free:
            ui.call_from_thread(self._counted, text, tokens)
            return
        kept, kept_tokens = paste_budget.fit_text(engine.count_tokens, text, b.free)
        message = paste_budget.too_long_message(tokens, b, text, kept, kept_tokens)
        ui.call_from_thread(self._too_long, text, message, kept, kept_tokens)

    def _counted(self, text: str, tokens: int) -> None:
        chip = self.chip
        if chip is not None and chip.text == text:  # not replaced or removed while it was counted
            chip.set_tokens(tokens)

    def _too_long(self, text: str, message: str, kept: str, kept_tokens: int) -> None:
        async def decided(truncate: bool | None) -> None:
            chip = self.chip
            if chip is None or chip.text != text:
                return
            if truncate and kept:
                chip.replace_text(kept, kept_tokens)
                self.prompt.notify(f"Pasted document truncated to {kept_tokens:,} tokens")
            else:
                await self.remove()
                self.prompt.notify("Paste cancelled")
            self.prompt.focus()

        self.ui.push_screen(TooLongScreen(message), decided)
