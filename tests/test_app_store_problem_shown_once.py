"""When the store reports a problem (it degrades instead of crashing), the app says so once."""

from __future__ import annotations

import pytest
from app_support import make_app, ready, wait_until

from parley.app.store import Store

pytestmark = pytest.mark.anyio


async def test_store_problem_is_notified_once(tmp_path):
    store = Store(tmp_path / "parley.db")
    app, _ = make_app(tmp_path, store=store)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(app, pilot)
        message = f"The conversation database {tmp_path / 'parley.db'} is locked; messages are kept in memory"
        store.problem = message  # what a degraded store sets
        await wait_until(lambda: any(str(n.message) == message for n in app._notifications))
        for _ in range(3):  # the timer's later checks, run here so the test does not wait on the clock
            app._check_store()
        await pilot.pause()
        assert [str(n.message) for n in app._notifications].count(message) == 1
        store.problem = None
        await wait_until(lambda: app._store_problem is None)
