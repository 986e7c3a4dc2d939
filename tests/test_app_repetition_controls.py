"""Repetition control: sliders for repeat penalty (and its window), frequency and presence penalties
that write the live params, and the same as flags of `parley` and `parley generate`."""

from __future__ import annotations

import pytest
from app_support import make_app, ready, send, wait_until
from fake_engine import FakeEngine

from parley.app import cli
from parley.app.widgets.slider import Slider

pytestmark = pytest.mark.anyio


def test_flags_set_the_params():
    for command in ("chat", "generate"):
        argv = [command, "--repeat-penalty", "1.15", "--repeat-last-n", "128", "--frequency-penalty", "0.5",
                "--presence-penalty", "0.25"] + (["q"] if command == "generate" else [])
        params = cli.params_from_args(cli.build_parser().parse_args(argv))
        assert (params.repeat_penalty, params.repeat_last_n, params.frequency_penalty,
                params.presence_penalty) == (1.15, 128, 0.5, 0.25)
    defaults = cli.params_from_args(cli.build_parser().parse_args(["generate", "q"]))
    assert (defaults.repeat_penalty, defaults.repeat_last_n, defaults.frequency_penalty,
            defaults.presence_penalty) == (1.0, 64, 0.0, 0.0)


async def test_sliders_reach_the_engine(tmp_path):
    engine = FakeEngine()
    app, _ = make_app(tmp_path, engine)
    async with app.run_test(size=(120, 50)) as pilot:
        await ready(app, pilot)
        await pilot.press("f2")
        assert str(app.query_one("#label-repeat_penalty").render()) == "Repeat penalty  off"
        for attr, keys in (("repeat_penalty", ["right"] * 3), ("repeat_last_n", ["right"] * 4),
                           ("frequency_penalty", ["right"] * 2), ("presence_penalty", ["right"])):
            app.query_one(f"#slider-{attr}", Slider).focus()
            await pilot.press(*keys)
        assert (app.params.repeat_penalty, app.params.repeat_last_n, app.params.frequency_penalty,
                app.params.presence_penalty) == (1.15, 128, 0.1, 0.05)
        assert str(app.query_one("#label-repeat_penalty").render()) == "Repeat penalty  1.15"
        await pilot.press("f2")
        await send(app, pilot, "hi")
        await wait_until(lambda: engine.calls and not app.generating)
        snap = engine.calls[0].snapshots[0]
        assert (snap.repeat_penalty, snap.repeat_last_n, snap.frequency_penalty, snap.presence_penalty) == (
            1.15, 128, 0.1, 0.05)
