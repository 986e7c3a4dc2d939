"""Esc stops at once and keeps what was shown, marked "(stopped)" in the chat, the history and exports; the next
reply sees exactly the text that was shown (without the mark) as the assistant turn."""

from __future__ import annotations

import pytest
from app_support import make_app, notices, ready, send, wait_until
from fake_engine import FakeEngine

from parley.app.reply_controller import STOPPED_MARK

pytestmark = pytest.mark.anyio

async def test_escape_cancels_and_next_reply_is_consistent(tmp_path):
    engine = FakeEngine(replies=["word " * 200, "Done."], delay=0.01)
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "Talk a lot")
        await wait_until(lambda: len(app.chat.messages) == 2 and len(app.chat.messages[1].content) > 20)
        await pilot.press("escape")
        assert not app.generating  # at once, not at the engine's leisure
        shown = app.chat.messages[1].content
        assert shown.endswith(STOPPED_MARK) and shown != "word " * 200
        assert "(stopped)" in str(app.chat.messages[1].query_one(".message--body").source)
        await wait_until(lambda: engine.calls[0].reason == "cancelled")
        await pilot.pause(0.1)
        assert app.chat.messages[1].content == shown  # nothing arrives after the stop
        await send(app, pilot, "Thanks")
        await wait_until(lambda: len(engine.calls) == 2 and not app.generating)
        assert engine.calls[1].messages == [
            {"role": "user", "content": "Talk a lot"},
            {"role": "assistant", "content": shown.removesuffix(STOPPED_MARK)},
            {"role": "user", "content": "Thanks"},
        ]
        # What was shown is also what history keeps.
        stored = app.store.messages(app.conversation.id)
        assert [m.content for m in stored] == ["Talk a lot", shown, "Thanks", "Done."]
        assert shown in app.store.export_markdown(app.conversation.id)


async def test_escape_before_first_token_keeps_the_turn_and_says_so(tmp_path):
    engine = FakeEngine(replies=["never shown", "Second try."], delay=5.0)
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "never mind")
        await wait_until(lambda: app.generating and engine.calls)
        await pilot.press("escape")
        await wait_until(lambda: not app.generating)
        # The question stays, on screen and in history; no empty reply is kept; the user is told.
        assert [(m.role, m.content) for m in app.chat.messages] == [("user", "never mind")]
        assert [m.content for m in app.store.messages(app.conversation.id)] == ["never mind"]
        assert app.prompt.text == "" and app.prompt.has_focus
        assert await notices(app, "stopped before its first token")
        engine.delay = 0.0
        await pilot.press("ctrl+r")  # regenerate answers the kept question
        await wait_until(lambda: len(engine.calls) == 2 and not app.generating)
        assert engine.calls[1].messages == [{"role": "user", "content": "never mind"}]
        assert app.chat.messages[-1].content == "Second try."
