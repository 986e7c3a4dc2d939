"""The status bar's ctx is true: after a resume, after a truncated paste, and at the window's end."""

from __future__ import annotations

import pytest
from app_support import make_app, notices, ready, send, wait_until
from fake_engine import FakeEngine, split_tokens
from textual import events

from parley.app.paste_budget import budget
from parley.app.screens.dialogs import TooLongScreen
from parley.app.screens.history import HistoryScreen
from parley.app.store import Store

pytestmark = pytest.mark.anyio


def ctx(app) -> str:
    return next(p for p in app.status.figures() if p.startswith("ctx "))


async def test_ctx_after_resume_counts_the_conversation(tmp_path):
    engine = FakeEngine(replies=["one two three four five six"])
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(120, 30)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "alpha beta gamma")
        await wait_until(lambda: engine.calls and not app.generating)
        after_reply = app.status.context_used
        # The engine's own count after the reply: its prompt plus the reply's tokens.
        assert after_reply == 3 + len(split_tokens("one two three four five six"))
    store = Store(tmp_path / "parley.db")
    app, _ = make_app(tmp_path, FakeEngine(), store=store)
    async with app.run_test(size=(120, 30)) as pilot:
        await ready(app, pilot)
        assert ctx(app) == "ctx 0/4,096"
        await pilot.press("f3")
        await wait_until(lambda: isinstance(app.screen, HistoryScreen))
        await pilot.press("enter")
        await wait_until(lambda: len(app.chat.messages) == 2)
        texts = ["alpha beta gamma", "one two three four five six"]
        expected = budget(4096, sum(engine.count_tokens(t) for t in texts), 0, 0).used
        await wait_until(lambda: app.status.context_used == expected)
        assert ctx(app) == f"ctx {expected:,}/4,096"


async def test_truncated_paste_keeps_the_reply_room_and_ctx_never_exceeds_the_window(tmp_path):
    window = 400
    engine = FakeEngine(replies=["word " * 500], context_window=window, stop_at_window=True)
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(120, 30)) as pilot:
        await ready(app, pilot)
        app.params.max_new_tokens = 60
        app.prompt.focus()
        app.post_message(events.Paste("\n".join(f"line {i} of the report" for i in range(300))))
        await wait_until(lambda: isinstance(app.screen, TooLongScreen))
        await pilot.press("t")
        await wait_until(lambda: app.attachment is not None and app.attachment.tokens is not None)
        doc_tokens = app.attachment.tokens
        b = budget(window, 0, 0, 60)
        assert doc_tokens <= b.free
        # What the engine is given still leaves the promised room for the reply.
        assert b.used + doc_tokens + 60 <= window
        await send(app, pilot, "sum up")
        await wait_until(lambda: engine.calls and not app.generating)
        assert engine.calls[0].reason == "length"  # max tokens (60) or the window: either way it stopped
        used = app.status.context_used
        assert 0 < used <= window and ctx(app) == f"ctx {min(used, window):,}/{window}"


async def test_ctx_at_the_window_end_is_capped_and_the_user_is_told(tmp_path):
    window = 64
    engine = FakeEngine(replies=["word " * 200], context_window=window, stop_at_window=True)
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(120, 30)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "go on")
        await wait_until(lambda: engine.calls and not app.generating)
        assert ctx(app) == f"ctx {window}/{window}"
        assert await notices(app, "context window")
