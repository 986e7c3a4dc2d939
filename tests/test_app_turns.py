"""Regenerate, edit-and-resend, new chat, copy, the command palette and the help screen."""

from __future__ import annotations

import pytest
from app_support import make_app, ready, send, wait_until
from fake_engine import FakeEngine
from textual.command import CommandList

from parley.app.screens.help import HelpScreen
from parley.app.widgets.message import code_blocks

pytestmark = pytest.mark.anyio


async def test_regenerate_replaces_the_last_reply(tmp_path):
    engine = FakeEngine(replies=["First try.", "Second try."])
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "q")
        await wait_until(lambda: len(engine.calls) == 1 and not app.generating)
        await pilot.press("ctrl+r")
        await wait_until(lambda: len(engine.calls) == 2 and not app.generating)
        assert engine.calls[1].messages == [{"role": "user", "content": "q"}]
        assert [m.content for m in app.chat.messages] == ["q", "Second try."]
        assert [m.content for m in app.store.messages(app.conversation.id)] == ["q", "Second try."]


async def test_edit_last_message_and_resend(tmp_path):
    engine = FakeEngine(replies=["A.", "B."])
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "Wrong question")
        await wait_until(lambda: len(engine.calls) == 1 and not app.generating)
        app.prompt.focus()
        await pilot.press("up")  # in an empty prompt: edit the last message
        await pilot.pause()
        assert app.prompt.text == "Wrong question" and app.chat.messages == []
        app.prompt.load_text("Right question")
        await pilot.press("enter")
        await wait_until(lambda: len(engine.calls) == 2 and not app.generating)
        assert engine.calls[1].messages == [{"role": "user", "content": "Right question"}]
        assert [m.content for m in app.store.messages(app.conversation.id)] == ["Right question", "B."]


async def test_new_chat_and_copy(tmp_path):
    app, engine = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "code please")
        await wait_until(lambda: engine.calls and not app.generating)
        app.chat_screen.action_copy_reply(code=True)
        assert app.clipboard == "def add(a: int, b: int) -> int:\n    return a + b"
        reply = app.chat.messages[-1]
        reply.focus()
        await pilot.press("c")
        assert app.clipboard == reply.content
        first = app.conversation.id
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.chat.messages == [] and app.conversation is None
        await send(app, pilot, "again")
        await wait_until(lambda: len(engine.calls) == 2 and not app.generating)
        assert app.conversation.id != first and len(engine.sessions) == 2


async def test_palette_runs_app_commands_and_help_opens(tmp_path):
    app, _ = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"sampling panel")
        await wait_until(lambda: app.screen.query_one(CommandList).option_count > 0)
        await pilot.press("down", "enter")
        await wait_until(lambda: app.query_one("#params").display)
        await pilot.press("f1")
        await wait_until(lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("escape")
        await wait_until(lambda: not isinstance(app.screen, HelpScreen))


def test_code_blocks():
    text = "a\n```py\nx = 1\n```\nb\n~~~\ny\n~~~\n"
    assert code_blocks(text) == ["x = 1", "y"]


async def test_theme_choice_is_remembered(tmp_path):
    app, _ = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        app.theme = "nord"
        await pilot.pause()
    app, _ = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        assert app.theme == "nord"
