"""The reply lifecycle: start a reply on a worker thread, drain its events into the view, finish it.

The engine thread only pushes into a `ReplyBuffer` (streaming.py); the UI drains it on a timer, so the
engine never waits for the UI and the UI never waits for the model. Stopping is immediate: the reply
keeps what was shown and the engine stops at its next round.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from textual.message import Message
from textual.screen import Screen

from parley.app import paste_budget
from parley.app.engine_lifecycle import in_background
from parley.app.store import Store
from parley.app.streaming import ActiveReply
from parley.app.widgets.message import ChatMessage, ChatView
from parley.app.widgets.params_panel import ParamsPanel
from parley.app.widgets.status_bar import StatusBar
from parley.engine.events import Done, Notice
from parley.engine.params import GenerationParams
from parley.engine.protocol import EngineLike, SessionLike

# Marks on a reply that did not finish: kept in the chat, the history and exports, never sent to the model
# (it continues from the text it wrote, so its cached context still matches).
INTERRUPTED_MARK = "\n\n*[reply interrupted]*"  # the app quit mid-reply
STOPPED_MARK = "\n\n*(stopped)*"  # Esc


def without_marks(content: str) -> str:
    for mark in (INTERRUPTED_MARK, STOPPED_MARK):
        content = content.removesuffix(mark)
    return content


class ReplyStarted(Message):
    """A reply began streaming."""


class ReplyFinished(Message):
    """The reply in flight ended (finished, stopped, failed): an engine waiting for it may come in."""


class ReplyController:
    """Owns the reply in flight, if any: start, stop or wind down for quitting.

    It streams into the conversation view and shows figures on the status bar and the sampling panel it is
    mounted on; `ReplyStarted` / `ReplyFinished`, posted to the screen, tell it."""

    def __init__(self, store: Store, batch_interval: float) -> None:
        self.store = store
        self.batch_interval = batch_interval
        self.active: ActiveReply | None = None
        self._finishing: ActiveReply | None = None  # ended, not yet rendered and saved
        self._timer = None
        self.screen: Screen
        self.chat: ChatView
        self.status: StatusBar
        self.panel: ParamsPanel

    @property
    def busy(self) -> bool:
        """A reply is in flight or still being rendered and saved (set and cleared on the UI thread, so it never
        disagrees with the screen). Until it is saved, a regenerate or an edit would act on a turn the store
        does not hold yet, and a quit would shut the app down under its last render."""
        return self.active is not None or self._finishing is not None

    def mount(self, screen: Screen, chat: ChatView, status: StatusBar, panel: ParamsPanel) -> None:
        self.screen, self.chat, self.status, self.panel = screen, chat, status, panel
        self._timer = chat.set_interval(self.batch_interval, self.drain, pause=True)

    async def start(self, engine: EngineLike, session: SessionLike, conversation_id: int,
                    messages: list[dict[str, str]], params: GenerationParams,
                    documents: dict[int, str] | None = None) -> None:
        """Start a reply to `messages`, saved in `conversation_id`; `documents` names the ones that carry a
        document (kept the longest)."""
        self.chat.anchor()
        view = ChatMessage("assistant")
        await self.chat.mount(view)
        view.start_stream()
        reply = ActiveReply(view, conversation_id)
        self.active = reply
        self.screen.post_message(ReplyStarted())
        self.panel.reply_progress(0)
        self._timer.resume()
        fit = partial(paste_budget.fit_conversation, engine.count_tokens, engine.context_window, messages,
                      documents or {}, session.system_prompt or "", params.max_new_tokens)
        in_background(lambda: self._run(session, fit, params, reply), "parley-reply")

    def _run(self, session: SessionLike, fit: Callable[[], tuple[list[dict[str, str]], str | None]],
             params: GenerationParams, reply: ActiveReply) -> None:
        # One reply at a time, even while a cancelled one winds down: the engine waits (SessionLike.reply).
        try:
            messages, left_out = fit()  # counting tokens takes a moment: here, off the UI thread
            if left_out:
                reply.buffer.push(Notice(left_out))
            for event in session.reply(messages, params, reply.cancel):
                reply.buffer.push(event)
                if isinstance(event, Done):
                    return
            reply.buffer.push(Done("eos"))
        except Exception as error:  # reported in the UI; the reply keeps what was shown
            reply.buffer.push(Done("error", f"{type(error).__name__}: {error}"))

    async def drain(self) -> None:
        reply, status = self.active, self.status
        if reply is None:
            self._timer.pause()
            return
        batch = reply.buffer.drain()
        if batch.text:
            await reply.view.append(batch.text, batch.drafted)
        if reply is not self.active:  # stopped while we were writing
            return
        for text in batch.notices:
            status.notify(text, severity="warning", markup=False)
        if batch.stats is not None:
            note = getattr(batch.stats, "speculation_note", "")  # e.g. auto turned a slow drafter off
            # Once a reply: auto may pause, resume and pause again, each note with its own figures.
            if note and "speculation" not in reply.notes:
                reply.notes.add("speculation")
                status.notify(note, title="Speculation", severity="warning", timeout=10, markup=False)
            reply.has_stats = True
            status.live = None
            status.stats = batch.stats
            if batch.stats.context_tokens:
                status.context_used = batch.stats.context_tokens
        elif not reply.has_stats:
            status.live = reply.buffer.live_figures()
        status.prefill = reply.buffer.prefill_figures()
        self.panel.reply_progress(reply.buffer.tokens)
        if batch.done is not None:
            await self.finish(reply, batch.done)

    async def finish(self, reply: ActiveReply, done: Done, *, interrupted: bool = False) -> None:
        if reply.finished:
            return
        reply.finished = True
        self.active = None
        self._finishing = reply
        try:
            await self._wind_up(reply, done, interrupted)
        finally:
            self._finishing = None
        self.screen.post_message(ReplyFinished())

    async def _wind_up(self, reply: ActiveReply, done: Done, interrupted: bool) -> None:
        status = self.status
        self._timer.pause()
        status.live = None
        status.prefill = None
        self.panel.reply_progress(None)
        view = reply.view
        mark = ""
        if view.content and done.reason == "cancelled":
            mark = INTERRUPTED_MARK if interrupted else STOPPED_MARK
        if view.content:  # saved before the last render: a quit during the render loses nothing
            view.db_id = self.store.add_message(reply.conversation_id, "assistant", view.content + mark)
        if mark:
            await view.append(mark)
        await view.finish()
        if not view.content:
            await view.remove()
            if done.reason == "cancelled" and not interrupted:
                # The question stays: the user can regenerate, edit it, or ask something else.
                status.notify("Reply stopped before its first token: Ctrl+R asks again, Ctrl+G edits the question")
        if done.reason == "error":
            status.notify(f"Generation failed: {done.detail}", severity="error", timeout=10, markup=False)
        elif done.reason == "length":
            if "context" in done.detail:
                status.notify(f"Stopped: {done.detail}", severity="warning", markup=False)
            else:
                status.notify("Stopped at the max tokens limit (F2 to raise it)")

    async def stop(self) -> None:
        """Stop now: the reply keeps exactly what is on screen; the engine stops at its next round."""
        reply = self.active
        if reply is None:
            return
        reply.cancel.set()
        await self.finish(reply, Done("cancelled"))

    async def interrupt(self) -> None:
        """Quitting mid-reply: drain what already arrived, save it marked as interrupted, stop the engine."""
        reply = self.active
        if reply is None:
            return
        reply.cancel.set()
        batch = reply.buffer.drain()
        if batch.text:
            await reply.view.append(batch.text, batch.drafted)
        await self.finish(reply, Done("cancelled"), interrupted=True)

    def cancel_now(self) -> None:
        """The app is going away: let the engine thread stop at its next round instead of running on."""
        if self.active is not None:
            self.active.cancel.set()
            self.active = None  # nothing is drawn any more: the screen is going
        if self._timer is not None:
            self._timer.pause()
