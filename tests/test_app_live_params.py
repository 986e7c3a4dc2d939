"""A slider moved while a reply streams reaches the engine at a later round of that same reply."""

from __future__ import annotations

import pytest
from app_support import make_app, ready, send, wait_until
from fake_engine import FakeEngine

from parley.app.widgets.slider import Slider

pytestmark = pytest.mark.anyio

async def test_slider_moved_mid_stream_reaches_next_round(tmp_path):
    # The engine holds inside round 5 (its params already read) while the slider moves.
    engine = FakeEngine(replies=["tok " * 60], hold_at=5)
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        await send(app, pilot, "go")
        await pilot.press("f2")  # the panel opens focused on the temperature slider
        slider = app.query_one("#slider-temperature", Slider)
        assert slider.has_focus
        await wait_until(engine.holding.is_set)
        await pilot.press("right", "right")  # 0.70 -> 0.80
        assert app.params.temperature == 0.8  # the live object changed immediately
        engine.release.set()
        await wait_until(lambda: not app.generating, timeout=10)
        temps = [s.temperature for s in engine.calls[0].snapshots]
        # Rounds 0-5 read 0.7 (round 5 before the change), every later round reads 0.8.
        assert temps[:6] == [0.7] * 6 and len(temps) > 6 and set(temps[6:]) == {0.8}
        applied = str(app.query_one("#applied").render())
        assert applied == "temperature = 0.8 · applied after token 5"


async def test_panel_controls_write_the_live_params(tmp_path):
    app, _ = make_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        await pilot.press("f2")
        assert app.query_one("#params").display
        await pilot.press("tab", "end")  # top-p to its maximum (off)
        assert app.params.top_p == 1.0
        await pilot.press("tab", "right", "right", "right")  # top-k 0 -> 3
        assert app.params.top_k == 3
        app.query_one("#speculation").value = "off"
        await pilot.pause()
        assert app.params.speculation == "off"
        seed = app.query_one("#seed")
        seed.value = "1234"
        await pilot.pause()
        assert app.params.seed == 1234
        app.query_one("#max-tokens").value = "64"
        await pilot.pause()
        assert app.params.max_new_tokens == 64
        app.params.validate()
        await pilot.press("f2")
        assert not app.query_one("#params").display and app.prompt.has_focus
