"""On a message (reached with Tab), Esc or typing sends focus back to the prompt; typed text is kept."""

from __future__ import annotations

import pytest
from app_support import burst, make_app, notices, ready, send, wait_until
from fake_engine import FakeEngine

from parley.app.widgets.message import ChatMessage

pytestmark = pytest.mark.anyio


async def _focus_a_message(app, pilot) -> ChatMessage:
    await send(app, pilot, "hello")
    await wait_until(lambda: app.engine.calls and not app.generating)
    message = app.chat.messages[-1]
    message.focus()
    await pilot.pause()
    assert message.has_focus
    return message


async def test_escape_on_a_message_returns_to_the_prompt(tmp_path):
    app, _ = make_app(tmp_path, FakeEngine())
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await _focus_a_message(app, pilot)
        await pilot.press("escape")
        await wait_until(lambda: app.prompt.has_focus)


async def test_typing_on_a_message_types_into_the_prompt(tmp_path):
    app, _ = make_app(tmp_path, FakeEngine())
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await _focus_a_message(app, pilot)
        await pilot.press("w", "h", "a", "t")
        await wait_until(lambda: app.prompt.has_focus and app.prompt.text == "what")


async def test_message_keys_still_work_on_a_message(tmp_path):
    app, _ = make_app(tmp_path, FakeEngine())
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        message = await _focus_a_message(app, pilot)
        await pilot.press("c")  # copy: a message key, not text for the prompt
        assert message.has_focus and app.prompt.text == ""
        assert await notices(app, "Message copied")


async def test_a_burst_typed_on_the_conversation_lands_whole_in_the_prompt(tmp_path):
    app, _ = make_app(tmp_path, FakeEngine())
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await pilot.click("#chat")  # a click on the conversation takes the focus there
        assert app.chat.has_focus
        text = "What is the capital of France?"
        burst(app, list(text))
        await wait_until(lambda: app.prompt.text == text and app.prompt.has_focus)
