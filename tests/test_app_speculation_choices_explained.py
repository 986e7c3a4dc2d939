"""The speculation choice says in one line what it does, and "Draft model" is offered only when a draft model is
loaded: without one it is absent with the reason shown, and a saved choice of it falls back to auto instead of
silently running without speculation."""

from __future__ import annotations

import pytest
from app_support import make_app, ready, wait_until
from fake_engine import FakeEngine

from parley.engine.params import GenerationParams

pytestmark = pytest.mark.anyio


def help_line(app) -> str:
    return str(app.panel.query_one("#speculation-help").render())


async def test_each_choice_says_what_it_does(tmp_path):
    app, _ = make_app(tmp_path, FakeEngine())
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        select = app.panel.query_one("#speculation")
        seen = set()
        for mode in ("off", "prompt-lookup", "auto"):
            select.value = mode
            await wait_until(lambda mode=mode: app.params.speculation == mode)
            await pilot.pause()
            seen.add(help_line(app))
            assert help_line(app) and "\n" not in help_line(app)
        assert len(seen) == 3


async def test_draft_model_is_not_offered_without_one(tmp_path):
    engine = FakeEngine()
    engine.draft = None  # a local engine that was started without --draft
    app, _ = make_app(tmp_path, engine, params=GenerationParams(speculation="draft"))
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        await wait_until(lambda: app.panel.has_draft is False)
        select = app.panel.query_one("#speculation")
        assert "draft" not in [value for _, value in select._options]
        assert app.params.speculation == "auto" and select.value == "auto"
        assert "--draft" in help_line(app)


async def test_draft_model_is_offered_with_one(tmp_path):
    engine = FakeEngine()
    engine.draft = object()
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        await wait_until(lambda: app.panel.has_draft is True)
        assert "draft" in [value for _, value in app.panel.query_one("#speculation")._options]
