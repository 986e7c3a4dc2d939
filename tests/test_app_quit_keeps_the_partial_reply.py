"""Ctrl+Q mid-reply: the reply is saved as it stands, marked as interrupted, and the engine stops."""

from __future__ import annotations

import pytest
from app_support import make_app, ready, send, wait_until
from fake_engine import FakeEngine, split_tokens

from parley.app.reply_controller import INTERRUPTED_MARK
from parley.app.store import Store

pytestmark = pytest.mark.anyio


async def test_ctrl_q_saves_the_partial_reply_marked_interrupted(tmp_path):
    reply = "word " * 100
    engine = FakeEngine(replies=[reply], hold_at=7)
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "talk")
        await wait_until(engine.holding.is_set)
        conversation = app.conversation.id
        await pilot.press("ctrl+q")
    await wait_until(lambda: engine.calls[0].reason == "cancelled")
    stored = Store(tmp_path / "parley.db").messages(conversation)
    assert [m.role for m in stored] == ["user", "assistant"]
    # Everything the engine produced before the quit is kept (even what the UI had not drawn yet).
    assert stored[1].content == "".join(split_tokens(reply)[:7]) + INTERRUPTED_MARK


async def test_ctrl_q_before_the_first_token_keeps_the_question(tmp_path):
    engine = FakeEngine(hold_at=0)
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "a question")
        await wait_until(engine.holding.is_set)
        conversation = app.conversation.id
        await pilot.press("ctrl+q")
    assert [m.content for m in Store(tmp_path / "parley.db").messages(conversation)] == ["a question"]
