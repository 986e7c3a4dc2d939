"""In the history's search box, Down goes on to the matches (it used to stay in the box)."""

import pytest
from app_support import make_app, on_screen, ready, send, wait_until
from fake_engine import FakeEngine

from parley.app.screens.history import HistoryScreen

pytestmark = pytest.mark.anyio


async def test_down_leaves_the_search_box(tmp_path):
    engine = FakeEngine(replies=["Paris.", "Blue."])
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(app, pilot)
        for i, question in enumerate(["France?", "Sky colour?"]):
            await pilot.press("ctrl+n")
            await send(app, pilot, question)
            await wait_until(lambda i=i: len(engine.calls) == i + 1 and not app.generating)
        await pilot.press("f3")
        await on_screen(app, HistoryScreen)
        await pilot.press("slash")
        assert app.focused is app.screen.query_one("#history-search")
        await pilot.press("down")
        assert app.focused is app.screen.query_one("#history-list")
        await pilot.press("down", "enter")  # the second conversation listed
        await wait_until(lambda: app.sub_title == "France?")
