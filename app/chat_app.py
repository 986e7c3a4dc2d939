"""The Parley chat app: conversation, composer, live sampling panel, status bar.

Threads: the engine loads and replies in thread workers. A reply's events go into a `ReplyBuffer` (streaming.py)
that the UI drains on a timer (every ~40 ms), so deltas are coalesced into one `MarkdownStream.write`
per batch, the engine thread never waits for the UI, and the UI never waits for the model.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.theme import Theme
from textual.widgets import Footer, Header

from parley.app.commands import ParleyCommands
from parley.app.screens.dialogs import SystemPromptScreen, TooLongScreen
from parley.app.screens.help import HelpScreen
from parley.app.screens.history import Deleted, HistoryScreen, Renamed
from parley.app.screens.loading import LoadingScreen
from parley.app.store import Conversation, Store, compose_user_content
from parley.app.streaming import ActiveReply
from parley.app.widgets.attachment import Attachment
from parley.app.widgets.message import ChatMessage, ChatView
from parley.app.widgets.params_panel import ParamsPanel
from parley.app.widgets.prompt import PromptInput
from parley.app.widgets.status_bar import StatusBar
from parley.engine.events import Done
from parley.engine.params import GenerationParams
from parley.models.progress import Progress, ProgressFn

EngineLoader = Callable[[ProgressFn | None], Any]  # returns an Engine (or a test double with its API)

SUMMARISE_PROMPT = "Summarise the pasted document: the main points as a short bulleted list."
PROGRESS_INTERVAL_S = 0.1


def fit_text(count_tokens: Callable[[str], int], text: str, budget: int) -> tuple[str, int]:
    """The longest prefix of `text` (whole lines when possible) within `budget` tokens, and its count."""
    ends = [i + 1 for i, c in enumerate(text) if c == "\n"]
    if not ends or ends[-1] != len(text):
        ends.append(len(text))

    def largest(cuts: list[int]) -> int:
        lo, hi, best = 0, len(cuts) - 1, -1
        while lo <= hi:
            mid = (lo + hi) // 2
            if count_tokens(text[: cuts[mid]]) <= budget:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        return best

    best = largest(ends)
    if best >= 0:
        kept = text[: ends[best]].rstrip("\n")
    else:  # not even the first line fits: cut inside it
        chars = list(range(1, ends[0] + 1))
        i = largest(chars)
        kept = text[: chars[i]] if i >= 0 else ""
    return kept, count_tokens(kept) if kept else 0


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:48] or "conversation"


class ParleyApp(App[int]):
    """A terminal chat over an in-process engine. The engine comes from `load_engine(progress)`."""

    CSS_PATH = Path(__file__).parent / "parley.tcss"  # absolute, so subclasses elsewhere keep it
    TITLE = "Parley"
    COMMANDS = App.COMMANDS | {ParleyCommands}
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+n", "new_chat", "New"),
        Binding("ctrl+r", "regenerate", "Regen"),
        Binding("ctrl+g", "edit_last", "Edit last", show=False),
        Binding("f2", "toggle_params", "Sliders"),
        Binding("f3", "history", "History"),
        Binding("f4", "system_prompt", "System", show=False),
        Binding("f1", "help", "Help"),
    ]

    generating: reactive[bool] = reactive(False, init=False)

    def __init__(
        self,
        load_engine: EngineLoader,
        *,
        model_ref: str | None = None,
        store: Store | None = None,
        params: GenerationParams | None = None,
        system_prompt: str = "",
        export_dir: Path | None = None,
        batch_interval: float = 0.04,
    ) -> None:
        super().__init__()
        self._load_engine = load_engine
        self.model_ref = model_ref
        self.store = store if store is not None else Store()
        self.params = params if params is not None else GenerationParams()
        self.export_dir = Path(export_dir) if export_dir is not None else Path.cwd()
        self.batch_interval = batch_interval
        self.engine: Any = None
        self.conversation: Conversation | None = None
        self._system_prompt_draft = system_prompt  # for the conversation not created yet
        self._session: Any = None
        self._reply: ActiveReply | None = None
        self._engine_lock = threading.Lock()  # one reply at a time, even while a cancelled one winds down
        self._context_used: int | None = 0  # tokens of this conversation; None: not known (resumed)
        self._loading: LoadingScreen | None = None

    # layout
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat-column"):
                yield ChatView(id="chat")
                with Vertical(id="composer"):
                    yield PromptInput(id="prompt")
            yield ParamsPanel(self.params, id="params")
        yield StatusBar(id="status")
        yield Footer(compact=True)

    @property
    def chat(self) -> ChatView:
        return self.query_one("#chat", ChatView)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one("#prompt", PromptInput)

    @property
    def status(self) -> StatusBar:
        return self.query_one("#status", StatusBar)

    @property
    def panel(self) -> ParamsPanel:
        return self.query_one("#params", ParamsPanel)

    @property
    def attachment(self) -> Attachment | None:
        found = self.query("#attachment")
        return found.first(Attachment) if found else None

    @property
    def system_prompt(self) -> str:
        return self.conversation.system_prompt if self.conversation else self._system_prompt_draft

    def on_mount(self) -> None:
        saved_theme = self.store.get_setting("theme")
        if saved_theme and saved_theme in self.available_themes:
            self.theme = saved_theme
        self.theme_changed_signal.subscribe(self, self._remember_theme)
        self._drain_timer = self.set_interval(self.batch_interval, self._drain, pause=True)
        self.prompt.focus()
        self._loading = LoadingScreen(self.model_ref)
        self.push_screen(self._loading)
        self.load_engine()

    def on_unmount(self) -> None:
        # Quitting mid-reply: let the engine thread stop at its next round instead of running on.
        if self._reply is not None:
            self._reply.cancel.set()

    def _remember_theme(self, theme: Theme) -> None:
        self.store.set_setting("theme", theme.name)

    def watch_generating(self, generating: bool) -> None:
        self.status.generating = generating
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return self.generating
        # Until the engine is loaded (the first-run screen) only quitting and help make sense.
        return self.engine is not None or action in ("help", "quit", "command_palette")

    # loading
    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def load_engine(self) -> None:
        """Load (maybe download and quantize) in a thread; progress is marshalled to the UI thread."""
        last, last_stage = 0.0, ""

        def progress(p: Progress) -> None:
            # Downloads report every chunk: pass at most ~10 a second, but never a new stage or an end.
            nonlocal last, last_stage
            now = time.monotonic()
            finished = bool(p.total) and p.done >= p.total
            if now - last >= PROGRESS_INTERVAL_S or finished or p.stage != last_stage:
                last, last_stage = now, p.stage
                self.call_from_thread(self._show_progress, p)

        try:
            engine = self._load_engine(progress)
        except Exception as error:  # shown to the user with what to do
            self.call_from_thread(self._load_failed, error)
        else:
            self.call_from_thread(self._engine_ready, engine)

    def _show_progress(self, p: Progress) -> None:
        if self._loading is not None and self._loading.is_attached:
            self._loading.show_progress(p)

    def _load_failed(self, error: BaseException) -> None:
        if self._loading is not None:
            self._loading.show_error(error)

    def _engine_ready(self, engine: Any) -> None:
        self.engine = engine
        self.refresh_bindings()
        self.status.model = engine.model_name
        self.status.quantization = engine.quantization
        self.status.context_window = engine.context_window
        if self._loading is not None and self.screen is self._loading:
            self.pop_screen()
        self._loading = None
        self.prompt.focus()
        chip = self.attachment
        if chip is not None and chip.tokens is None:
            self._count_attachment(chip.text, self._conversation_texts())

    # conversation
    def _ensure_conversation(self, first_text: str) -> Conversation:
        if self.conversation is None:
            title = (first_text.strip().splitlines() or ["Pasted document"])[0][:48]
            self.conversation = self.store.create_conversation(title, self._system_prompt_draft)
            self.sub_title = self.conversation.title
        return self.conversation

    def _ensure_session(self) -> Any:
        if self._session is None:
            self._session = self.engine.session(self.system_prompt or None)
        return self._session

    def _conversation_texts(self) -> list[str]:
        return [compose_user_content(m.content, m.attachment) for m in self.chat.messages]

    def engine_messages(self, exclude: ChatMessage | None = None) -> list[dict[str, str]]:
        """The visible conversation as the engine wants it: what is on screen is what the model saw."""
        return [
            {"role": m.role, "content": compose_user_content(m.content, m.attachment)}
            for m in self.chat.messages
            if m is not exclude
        ]

    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        await self.send(event.text)

    async def send(self, text: str) -> None:
        text = text.strip()
        chip = self.attachment
        if self.engine is None:
            self.notify("The model is still loading", severity="warning")
            return
        if self.generating:
            self.notify("A reply is streaming: Esc stops it", severity="warning")
            return
        if chip is not None and chip.tokens is None:
            self.notify("Still measuring the pasted document", severity="warning")
            return
        if not text and chip is None:
            return
        conversation = self._ensure_conversation(text or "Pasted document")
        doc, doc_tokens = (chip.text, chip.tokens) if chip is not None else (None, None)
        message = ChatMessage("user", text, doc, doc_tokens)
        message.db_id = self.store.add_message(conversation.id, "user", text, doc)
        await self.chat.mount(message)
        self.prompt.clear()
        await self._remove_attachment()
        await self._start_reply()

    async def _start_reply(self) -> None:
        self.chat.anchor()
        view = ChatMessage("assistant")
        await self.chat.mount(view)
        view.start_stream()
        messages = self.engine_messages(exclude=view)
        reply = ActiveReply(view)
        self._reply = reply
        self.generating = True
        self.panel.reply_progress(0)
        self._drain_timer.resume()
        self._run_reply(self._ensure_session(), messages, reply)

    @work(thread=True, group="reply", exit_on_error=False)
    def _run_reply(self, session: Any, messages: list[dict[str, str]], reply: ActiveReply) -> None:
        with self._engine_lock:
            try:
                for event in session.reply(messages, self.params, reply.cancel):
                    reply.buffer.push(event)
                    if isinstance(event, Done):
                        return
                reply.buffer.push(Done("eos"))
            except Exception as error:  # reported in the UI; the reply keeps what was shown
                reply.buffer.push(Done("error", f"{type(error).__name__}: {error}"))

    async def _drain(self) -> None:
        reply = self._reply
        if reply is None:
            self._drain_timer.pause()
            return
        text, stats, done = reply.buffer.drain()
        if text:
            await reply.view.append(text)
        if reply is not self._reply:  # stopped while we were writing
            return
        if stats is not None:
            reply.has_stats = True
            self.status.live = None
            self.status.stats = stats
            self._context_used = stats.context_tokens or self._context_used
        elif not reply.has_stats:
            self.status.live = reply.buffer.live_figures()
        self.panel.reply_progress(reply.buffer.tokens)
        if done is not None:
            await self._finish_reply(reply, done)

    async def _finish_reply(self, reply: ActiveReply, done: Done) -> None:
        if reply.finished:
            return
        reply.finished = True
        self._reply = None
        self._drain_timer.pause()
        self.generating = False
        self.status.live = None
        self.panel.reply_progress(None)
        await reply.view.finish()
        if reply.view.content:
            assert self.conversation is not None
            reply.view.db_id = self.store.add_message(self.conversation.id, "assistant", reply.view.content)
        elif done.reason == "cancelled":
            # Nothing was shown: take the question back into the prompt, as if it was never sent.
            await reply.view.remove()
            await self._take_back_last_user_message()
        else:
            await reply.view.remove()
        if done.reason == "error":
            self.notify(f"Generation failed: {done.detail}", severity="error", timeout=10, markup=False)
        elif done.reason == "length":
            self.notify("Stopped at the max tokens limit (F2 to raise it)")

    async def _take_back_last_user_message(self) -> None:
        """Remove the last user message (and what follows) and put it back in the composer."""
        messages = self.chat.messages
        users = [i for i, m in enumerate(messages) if m.role == "user"]
        if not users:
            return
        last = messages[users[-1]]
        for m in messages[users[-1]:]:
            if m.db_id is not None:
                self.store.delete_message(m.db_id)
            await m.remove()
        self.prompt.load_text(last.content)
        self.prompt.move_cursor(self.prompt.document.end)
        if last.attachment is not None:
            await self._set_attachment(last.attachment, last.attachment_tokens)
        self.prompt.focus()

    # actions
    async def action_stop(self) -> None:
        """Stop now: the reply keeps exactly what is on screen; the engine stops at its next round."""
        reply = self._reply
        if reply is None:
            return
        reply.cancel.set()
        await self._finish_reply(reply, Done("cancelled"))

    async def action_regenerate(self) -> None:
        if self.generating or self.engine is None:
            return
        messages = self.chat.messages
        if messages and messages[-1].role == "assistant":
            if messages[-1].db_id is not None:
                self.store.delete_message(messages[-1].db_id)
            await messages[-1].remove()
            messages = messages[:-1]
        if messages and messages[-1].role == "user":
            await self._start_reply()
        else:
            self.notify("Nothing to regenerate yet")

    async def action_edit_last(self) -> None:
        if self.generating:
            self.notify("Esc stops the reply first", severity="warning")
            return
        await self._take_back_last_user_message()

    async def on_prompt_input_edit_last(self, event: PromptInput.EditLast) -> None:
        await self.action_edit_last()

    async def action_new_chat(self) -> None:
        await self.action_stop()
        await self.chat.remove_children()
        self.conversation = None
        self._session = None
        self._context_used = 0
        self._system_prompt_draft = ""
        self.status.stats = None
        self.sub_title = ""
        await self._remove_attachment()
        self.prompt.clear()
        self.prompt.focus()

    async def resume(self, conversation_id: int) -> None:
        conversation = self.store.conversation(conversation_id)
        if conversation is None:
            return
        await self.action_new_chat()
        self.conversation = conversation
        self.sub_title = conversation.title
        self._context_used = None
        views = []
        for m in self.store.messages(conversation_id):
            view = ChatMessage(m.role, m.content, m.attachment)
            view.db_id = m.id
            views.append(view)
        await self.chat.mount_all(views)
        self.chat.anchor()

    def action_toggle_params(self) -> None:
        main = self.query_one("#main")
        main.toggle_class("-params")
        if main.has_class("-params"):
            self.panel.query("Slider").first().focus()
        else:
            self.prompt.focus()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_history(self) -> None:
        async def chosen(conversation_id: int | None) -> None:
            if conversation_id is not None:
                await self.resume(conversation_id)

        self.push_screen(HistoryScreen(self.store, self.conversation.id if self.conversation else None), chosen)

    def on_renamed(self, event: Renamed) -> None:
        if self.conversation and self.conversation.id == event.conversation_id:
            self.conversation = self.store.conversation(event.conversation_id)
            self.sub_title = event.title

    async def on_deleted(self, event: Deleted) -> None:
        if self.conversation and self.conversation.id == event.conversation_id:
            await self.action_new_chat()

    def action_system_prompt(self) -> None:
        def saved(text: str | None) -> None:
            if text is None:
                return
            if self.conversation is not None:
                self.store.set_system_prompt(self.conversation.id, text)
                self.conversation = self.store.conversation(self.conversation.id)
            else:
                self._system_prompt_draft = text
            self._session = None  # the next reply starts a session with the new system prompt
            self.notify("System prompt saved: it applies from the next reply")

        self.push_screen(SystemPromptScreen(self.system_prompt), saved)

    def action_export(self) -> None:
        if self.conversation is None:
            self.notify("Nothing to export yet", severity="warning")
            return
        self.export_conversation(self.conversation.id)

    def export_conversation(self, conversation_id: int) -> Path:
        conversation = self.store.conversation(conversation_id)
        assert conversation is not None
        path = self.export_dir / f"{slug(conversation.title)}-{conversation_id}.md"
        path.write_text(self.store.export_markdown(conversation_id), encoding="utf-8")
        self.notify(f"Exported to {path}", markup=False)
        return path

    def _last_reply(self) -> ChatMessage | None:
        replies = [m for m in self.chat.messages if m.role == "assistant"]
        return replies[-1] if replies else None

    def action_copy_reply(self) -> None:
        if (reply := self._last_reply()) is not None:
            reply.action_copy_message()

    def action_copy_code(self) -> None:
        if (reply := self._last_reply()) is not None:
            reply.action_copy_code()

    # pasted documents
    async def on_prompt_input_large_paste(self, event: PromptInput.LargePaste) -> None:
        await self._set_attachment(event.text)

    async def on_prompt_input_summarise(self, event: PromptInput.Summarise) -> None:
        await self.action_summarise()

    async def action_summarise(self) -> None:
        if self.attachment is None:
            self.notify("Paste a document first, then Ctrl+S summarises it")
            return
        await self.send(SUMMARISE_PROMPT)

    async def _remove_attachment(self) -> None:
        if (chip := self.attachment) is not None:
            await chip.remove()
        self.prompt.has_attachment = False

    async def on_attachment_removed(self, event: Attachment.Removed) -> None:
        await self._remove_attachment()
        self.prompt.focus()

    async def _set_attachment(self, text: str, tokens: int | None = None) -> None:
        if self.attachment is not None:
            await self._remove_attachment()
            self.notify("The new paste replaces the previous one")
        chip = Attachment(text, id="attachment")
        await self.query_one("#composer").mount(chip, before=self.prompt)
        self.prompt.has_attachment = True
        if tokens is not None:
            chip.set_tokens(tokens)
        elif self.engine is not None:
            self._count_attachment(text, self._conversation_texts())

    def _budget(self, conversation_tokens: int) -> tuple[int, int, int]:
        """(free tokens for a paste, context window, tokens kept back for the reply)."""
        window = self.engine.context_window
        reserve = min(self.params.max_new_tokens, window // 4)
        return max(0, window - conversation_tokens - reserve), window, reserve

    @work(thread=True, group="count", exclusive=True, exit_on_error=False)
    def _count_attachment(self, text: str, conversation: list[str]) -> None:
        """Count tokens (and the fitting prefix, if it is too long) off the UI thread."""
        engine = self.engine
        used = self._context_used
        if used is None:
            used = sum(engine.count_tokens(t) for t in conversation)
        tokens = engine.count_tokens(text)
        free, window, reserve = self._budget(used)
        if tokens <= free:
            self.call_from_thread(self._attachment_counted, text, tokens)
            return
        kept, kept_tokens = fit_text(engine.count_tokens, text, free)
        lines, kept_lines = text.count("\n") + 1, (kept.count("\n") + 1 if kept else 0)
        message = (
            f"It is {tokens:,} tokens, but only {free:,} fit: the context window is {window:,} tokens, "
            f"this conversation uses {used:,} and {reserve:,} are kept for the reply.\n\n"
            f"Truncate keeps the first {kept_lines:,} of {lines:,} lines ({kept_tokens:,} tokens). "
            "Nothing is cut unless you choose it."
        )
        self.call_from_thread(self._attachment_too_long, text, message, kept, kept_tokens)

    def _attachment_counted(self, text: str, tokens: int) -> None:
        chip = self.attachment
        if chip is not None and chip.text == text:
            chip.set_tokens(tokens)

    def _attachment_too_long(self, text: str, message: str, kept: str, kept_tokens: int) -> None:
        async def decided(truncate: bool | None) -> None:
            chip = self.attachment
            if chip is None or chip.text != text:
                return
            if truncate and kept:
                chip.replace_text(kept, kept_tokens)
                self.notify(f"Pasted document truncated to {kept_tokens:,} tokens")
            else:
                await self._remove_attachment()
                self.notify("Paste cancelled")
            self.prompt.focus()

        self.push_screen(TooLongScreen(message), decided)
