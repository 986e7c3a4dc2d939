"""The first-run screen says which of the quantization's two passes it is in, so the distillation's "step 1 of
32" after "layer 30 of 30" reads as the next pass, not a count gone wrong."""

from __future__ import annotations

import threading

import pytest
from app_support import make_app, wait_until
from fake_engine import FakeEngine, loader

from parley.app.screens.loading import LoadingScreen
from parley.models.progress import Progress

pytestmark = pytest.mark.anyio

LAYERS = Progress("quantize", 30, 30, "layer", "layer 30/30", eta_s=0.0)
DISTILL = Progress("quantize", 1, 32, "step", "distilling the scales, step 1 of 32, ETA 60s", 60.0)


@pytest.mark.parametrize(("script", "said"), [([LAYERS], "pass 1 of 2: each layer in turn"),
                                              ([LAYERS, DISTILL], "pass 2 of 2: distilling the whole model")])
async def test_each_pass_is_named(tmp_path, script, said):
    gate = threading.Event()
    engine = FakeEngine()
    app, _ = make_app(tmp_path, engine, load=loader(engine, script, block=gate))
    async with app.run_test(size=(100, 30)) as pilot:
        try:
            stage = lambda: str(app.screen.query_one("#quantize-stage").render())
            await wait_until(lambda: isinstance(app.screen, LoadingScreen) and app.screen.query("#quantize-stage")
                             and said in stage())
            assert stage().startswith("Quantize (AWQ INT4) · ")
        finally:
            gate.set()
        await wait_until(lambda: app.engine is engine)
        await pilot.pause()
