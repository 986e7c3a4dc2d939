"""Send a message: the reply streams into the view, then renders whole; Enter sends, Ctrl+J breaks."""

from __future__ import annotations

import pytest
from app_support import make_app, notices, ready, send, wait_until
from fake_engine import DEFAULT_REPLY, FakeEngine, split_tokens

pytestmark = pytest.mark.anyio

async def test_send_streams_reply(tmp_path):
    engine = FakeEngine(hold_at=5)
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "How do I add two numbers?")
        # Mid-stream (the engine holds before its sixth token): the first five are on screen.
        first_five = "".join(split_tokens(DEFAULT_REPLY)[:5])
        await wait_until(lambda: engine.holding.is_set() and len(app.chat.messages) == 2
                         and app.chat.messages[1].content == first_five)
        assert app.generating and app.chat.messages[1].has_class("-streaming")
        engine.release.set()
        await wait_until(lambda: not app.generating)
        user, reply = app.chat.messages
        assert (user.role, user.content) == ("user", "How do I add two numbers?")
        assert reply.content == DEFAULT_REPLY and not reply.has_class("-streaming")
        assert engine.calls[0].messages == [{"role": "user", "content": "How do I add two numbers?"}]
        assert app.prompt.text == ""
        # The status bar shows the engine's figures.
        assert app.status.stats is not None and app.status.stats.tokens_per_s > 0
        assert "tok/s" in str(app.status.render())


async def test_enter_sends_and_ctrl_j_breaks_line(tmp_path):
    app, engine = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        app.prompt.focus()
        await pilot.press("h", "i", "ctrl+j", "y", "o")
        assert app.prompt.text == "hi\nyo"
        await pilot.press("enter")
        await wait_until(lambda: engine.calls and not app.generating)
        assert engine.calls[0].messages[-1]["content"] == "hi\nyo"


async def test_second_turn_sends_whole_conversation(tmp_path):
    app, engine = make_app(tmp_path, FakeEngine(replies=["First answer.", "Second answer."]))
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "one")
        await wait_until(lambda: len(engine.calls) == 1 and not app.generating)
        await send(app, pilot, "two")
        await wait_until(lambda: len(engine.calls) == 2 and not app.generating)
        assert engine.calls[1].messages == [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "First answer."},
            {"role": "user", "content": "two"},
        ]
        # One session per conversation: the engine reuses its cache across turns.
        assert len(engine.sessions) == 1


async def test_engine_error_is_reported_and_partial_kept(tmp_path):
    app, engine = make_app(tmp_path, FakeEngine(fail_at=3))
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "hi")
        await wait_until(lambda: engine.calls and not app.generating)
        await pilot.pause()
        assert app.chat.messages[-1].content == engine.calls[0].shown
        assert await notices(app, "scripted failure")


async def test_view_follows_the_bottom_unless_scrolled_up(tmp_path):
    engine = FakeEngine(replies=["line\n\n" * 200], hold_at=60)
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "lines please")
        chat = app.chat
        await wait_until(lambda: engine.holding.is_set() and chat.max_scroll_y > 10)
        await wait_until(lambda: chat.scroll_y >= chat.max_scroll_y - 2)  # following
        chat.focus()
        await pilot.press("pageup")
        # page up may animate: read the place once the scroll has reached its target (on a busy machine
        # the first frames land mid-animation)
        await wait_until(lambda: chat.scroll_y < chat.max_scroll_y and chat.scroll_y == chat.scroll_target_y)
        held, grown = chat.scroll_y, chat.max_scroll_y
        engine.release.set()
        await wait_until(lambda: not app.generating and chat.max_scroll_y > grown + 5, timeout=60)
        await pilot.pause()
        assert chat.scroll_y == held  # the user's place is kept while the reply grows


async def test_status_estimates_speed_until_the_engine_reports(tmp_path):
    engine = FakeEngine(replies=["tok " * 40], stats_every=None, hold_at=10)  # Stats only at the end
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(120, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "go")
        await wait_until(lambda: engine.holding.is_set() and app.status.live is not None
                         and app.status.live[0] == 10)
        line = str(app.status.render())
        assert "~" in line and "tok/s" in line and "ttft" in line and "10 tok" in line
        engine.release.set()
        await wait_until(lambda: not app.generating)
        assert app.status.live is None and "42.5 tok/s" in str(app.status.render())
