"""Esc stops a streaming reply wherever the focus is: in the sliders too (the first Esc used to move the focus
only, so the reply ran on); between replies it goes back to the prompt."""

import pytest
from app_support import make_app, ready, send, wait_until
from fake_engine import FakeEngine

from parley.app.widgets.slider import Slider

pytestmark = pytest.mark.anyio


async def test_one_esc_in_the_sliders_stops_the_reply(tmp_path):
    engine = FakeEngine(replies=["tok " * 60], hold_at=5)
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "go")
        await wait_until(engine.holding.is_set)
        await pilot.press("f2")
        assert isinstance(app.focused, Slider)
        await pilot.press("escape")
        await wait_until(lambda: not app.generating)
        assert engine.calls[0].reason == "cancelled" or app.chat.messages[-1].content.endswith("*(stopped)*")
        assert app.focused is app.prompt
        await pilot.press("f2", "escape")  # no reply: back to the prompt
        assert app.focused is app.prompt
