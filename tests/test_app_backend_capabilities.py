"""A backend that ignores a parameter gets that slider greyed out with the reason; one that reads
parameters once a reply says that changes apply from the next reply."""

from __future__ import annotations

import pytest
from app_support import make_app, ready, send, wait_until
from fake_engine import FakeEngine

from parley.app.widgets.slider import Slider
from parley.engine.protocol import Capabilities

pytestmark = pytest.mark.anyio


async def test_unsupported_parameter_is_greyed_out_with_its_reason(tmp_path):
    reason = "the server has no min-p sampling"
    engine = FakeEngine(capabilities=Capabilities(unsupported={"min_p": reason}))
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        await pilot.press("f2")
        slider = app.query_one("#slider-min_p", Slider)
        assert slider.disabled and slider.tooltip == reason
        assert reason in str(app.query_one("#label-min_p").render())
        assert not app.query_one("#slider-temperature", Slider).disabled
        slider.focus()
        await pilot.press("right")
        assert app.params.min_p == 0.0  # a disabled slider does not move


async def test_parameters_read_once_a_reply_say_so(tmp_path):
    engine = FakeEngine(replies=["tok " * 30], hold_at=3,
                        capabilities=Capabilities(live_params=False, live_params_note="sent with the request"))
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        assert "from the next reply" in str(app.query_one("#panel-title").render())
        await send(app, pilot, "go")
        await pilot.press("f2")
        await wait_until(engine.holding.is_set)
        await pilot.press("right")
        assert "applies from the next reply" in str(app.query_one("#applied").render())
        engine.release.set()
        await wait_until(lambda: not app.generating)
