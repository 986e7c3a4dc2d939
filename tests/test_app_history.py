"""Conversations persist across restarts; history resumes, renames, deletes and exports them."""

from __future__ import annotations

import pytest
from app_support import make_app, on_screen, ready, send, wait_until
from fake_engine import FakeEngine

from parley.app.screens.history import HistoryScreen
from parley.app.store import Store

pytestmark = pytest.mark.anyio


async def test_history_survives_restart_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_DATA_DIR", str(tmp_path / "data"))
    first = FakeEngine(replies=["Paris."])
    app, _ = make_app(tmp_path, first, store=Store())
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "Capital of France?")
        await wait_until(lambda: first.calls and not app.generating)
    assert (tmp_path / "data" / "parley.db").exists()

    second = FakeEngine(replies=["Berlin."])
    app, _ = make_app(tmp_path, second, store=Store())
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        assert app.chat.messages == []  # a restart opens a new chat
        await pilot.press("f3")
        await on_screen(app, HistoryScreen)
        await pilot.press("enter")
        await wait_until(lambda: len(app.chat.messages) == 2)
        assert [m.content for m in app.chat.messages] == ["Capital of France?", "Paris."]
        assert app.sub_title == "Capital of France?"
        await send(app, pilot, "And Germany?")
        await wait_until(lambda: second.calls and not app.generating)
        assert second.calls[0].messages[:2] == [
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "Paris."},
        ]


async def test_rename_and_delete(tmp_path):
    app, engine = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "first")
        await wait_until(lambda: engine.calls and not app.generating)
        conv_id = app.conversation.id
        await pilot.press("f3")
        await on_screen(app, HistoryScreen)
        await pilot.press("r")
        rename = app.screen.query_one("#history-rename")
        rename.value = "Renamed chat"
        await pilot.press("enter")
        await pilot.pause()
        assert app.store.conversation(conv_id).title == "Renamed chat"
        assert app.sub_title == "Renamed chat"
        await pilot.press("d")
        assert app.store.conversation(conv_id) is not None  # asks first
        await pilot.press("d")
        await pilot.pause()
        assert app.store.conversation(conv_id) is None
        assert app.conversation is None and app.chat.messages == []


async def test_system_prompt_is_per_conversation(tmp_path):
    app, engine = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await pilot.press("f4")
        await pilot.pause()
        app.screen.query_one("#system-text").load_text("You are terse.")
        await pilot.press("ctrl+s")
        await pilot.pause()
        await send(app, pilot, "hi")
        await wait_until(lambda: engine.calls and not app.generating)
        assert engine.sessions[-1].system_prompt == "You are terse."
        assert app.store.conversation(app.conversation.id).system_prompt == "You are terse."
        await pilot.press("ctrl+n")
        await send(app, pilot, "hello")
        await wait_until(lambda: len(engine.calls) == 2 and not app.generating)
        assert engine.sessions[-1].system_prompt is None


async def test_history_search_finds_titles_and_message_text(tmp_path):
    engine = FakeEngine(replies=["Paris is the capital.", "Use a list comprehension.", "Blue."])
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(app, pilot)
        for i, question in enumerate(["France?", "Python lists?", "Sky colour?"]):
            await pilot.press("ctrl+n")
            await send(app, pilot, question)
            await wait_until(lambda i=i: len(engine.calls) == i + 1 and not app.generating)
        await pilot.press("f3")
        await on_screen(app, HistoryScreen)
        screen = app.screen
        listed = lambda: [str(screen.query_one("#history-list").get_option_at_index(i).prompt).strip("● ")
                          .split("  ")[0] for i in range(screen.query_one("#history-list").option_count)]
        assert len(listed()) == 3
        await pilot.press("slash", *"comprehension")  # found in a reply, not the title
        await wait_until(lambda: listed() == ["Python lists?"])
        await pilot.press("enter")  # resumes the match
        await wait_until(lambda: app.sub_title == "Python lists?")
        assert [m.content for m in app.chat.messages] == ["Python lists?", "Use a list comprehension."]
