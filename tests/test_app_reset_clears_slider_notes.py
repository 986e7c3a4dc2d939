"""After F8 (reset to defaults) the panel shows the defaults and no note about a value that is gone."""

from __future__ import annotations

import pytest
from app_support import make_app, ready, wait_until

pytestmark = pytest.mark.anyio


async def test_reset_leaves_no_stale_note(tmp_path):
    app, _ = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        await pilot.press("f2", "right", "right")  # temperature 0.70 -> 0.80
        applied = app.panel.query_one("#applied")
        await wait_until(lambda: "temperature = 0.8" in str(applied.render()))
        await pilot.press("f8")
        await wait_until(lambda: app.params.temperature == 0.7)
        await pilot.pause()
        assert "0.8" not in str(applied.render())
        assert str(app.panel.query_one("#label-temperature").render()) == "Temperature  0.70"
