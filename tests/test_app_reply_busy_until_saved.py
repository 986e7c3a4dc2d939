"""A finished reply counts as in flight until it is rendered and saved, and it is saved before that last render:
a regenerate, an edit or a new question during the render cannot act on a turn the store does not hold yet, and a
quit (or the test harness leaving the app) during the render loses nothing."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import pytest
from app_support import make_app, ready, send, wait_until
from fake_engine import FakeEngine

from parley.app.store import Store
from parley.app.widgets.message import ChatMessage

pytestmark = pytest.mark.anyio


def hold_last_render(monkeypatch) -> tuple[asyncio.Event, asyncio.Event]:
    """(entered, release): the assistant's final render waits on `release` once `entered` is set."""
    entered, release = asyncio.Event(), asyncio.Event()
    render = ChatMessage.finish

    async def held(self: ChatMessage) -> None:
        if self.role == "assistant":
            entered.set()
            await release.wait()
        await render(self)

    monkeypatch.setattr(ChatMessage, "finish", held)
    return entered, release


@asynccontextmanager
async def in_last_render(tmp_path, monkeypatch, reply: str):
    """The app, its engine, the pilot and the release event, once the reply to "a question" is in its last render."""
    entered, release = hold_last_render(monkeypatch)
    app, engine = make_app(tmp_path, FakeEngine(replies=[reply]))
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "a question")
        await wait_until(entered.is_set)
        yield app, engine, pilot, release


async def test_busy_until_rendered_and_saved(tmp_path, monkeypatch):
    async with in_last_render(tmp_path, monkeypatch, "The answer.") as (app, engine, pilot, release):
        assert app.generating, "the reply counts as in flight while its last render runs"
        stored = app.store.messages(app.conversation.id)
        assert [(m.role, m.content) for m in stored] == [("user", "a question"), ("assistant", "The answer.")]
        await pilot.press("ctrl+r")  # a regenerate now would remove a turn whose id is not set yet
        await pilot.pause()
        assert len(engine.calls) == 1
        release.set()
        await wait_until(lambda: not app.generating)
        assert app.chat.messages[-1].db_id == stored[-1].id


async def test_quit_during_the_last_render_keeps_the_reply(tmp_path, monkeypatch):
    async with in_last_render(tmp_path, monkeypatch, "Kept.") as (app, _, pilot, _):
        conversation = app.conversation.id
        await pilot.press("ctrl+q")
    assert [m.content for m in Store(tmp_path / "parley.db").messages(conversation)] == ["a question", "Kept."]
