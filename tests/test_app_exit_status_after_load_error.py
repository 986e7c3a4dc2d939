"""Quitting from the "could not load the model" screen exits with status 1 (scripts and service managers
see the failure); quitting after a good load exits 0."""

from __future__ import annotations

import pytest
from app_support import make_app, ready, wait_until
from fake_engine import FakeEngine

from parley.app.screens.loading import LoadingScreen

pytestmark = pytest.mark.anyio


async def test_quit_after_a_failed_load_exits_1(tmp_path):
    def broken(progress):
        raise FileNotFoundError("no such model: org/missing")

    app, _ = make_app(tmp_path, load=broken)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(lambda: isinstance(app.screen, LoadingScreen) and app.screen.has_class("-failed"))
        await pilot.press("q")
    assert app.return_code == 1


async def test_quit_after_a_good_load_exits_0(tmp_path):
    app, _ = make_app(tmp_path, FakeEngine())
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        await pilot.press("ctrl+q")
    assert app.return_code == 0
