"""First run: download and quantization progress on screen while the engine loads; errors say what to do."""

from __future__ import annotations

import threading

import pytest
from app_support import make_app, wait_until
from fake_engine import FakeEngine, loader

from parley.app.screens.loading import LoadingScreen, error_hint, human_bytes
from parley.models.progress import Progress

pytestmark = pytest.mark.anyio

SCRIPT = [
    Progress("download", 400e6, 988e6, "B", "model.safetensors"),
    Progress("download", 988e6, 988e6, "B", "model.safetensors"),
    Progress("quantize", 12, 30, "layer", "layer 12/30", eta_s=40.0),
]


async def test_progress_is_shown_then_chat_opens(tmp_path):
    gate = threading.Event()
    engine = FakeEngine()
    app, _ = make_app(tmp_path, engine, load=loader(engine, SCRIPT, block=gate))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(lambda: isinstance(app.screen, LoadingScreen))
        await _check_progress(app, pilot, gate, engine)


async def _check_progress(app, pilot, gate, engine) -> None:
    try:
        screen = app.screen
        await wait_until(lambda: screen.query("#quantize-detail")
                         and "layer 12 of 30" in str(screen.query_one("#quantize-detail").render()))
        assert str(screen.query_one("#quantize-detail").render()) == "layer 12 of 30 · ETA 40s"
        assert str(screen.query_one("#download-detail").render()).startswith("988.0 MB / 988.0 MB")
        assert screen.query_one("#download-bar").percentage == 1.0
        assert screen.query_one("#quantize-bar").percentage == pytest.approx(0.4)
        assert app.engine is None
    finally:
        gate.set()
    await wait_until(lambda: app.engine is engine and not isinstance(app.screen, LoadingScreen))
    await pilot.pause()
    assert app.prompt.has_focus
    assert "fake-smol-135m · INT4 (AWQ)" in str(app.status.render())


async def test_the_distillation_steps_are_not_called_layers(tmp_path):
    """After the layers, the first run distils its scales (models/quantize/distill.py) in steps: the screen
    says so in the distillation's own words."""
    gate = threading.Event()
    engine = FakeEngine()
    script = [*SCRIPT[:2], Progress("quantize", 5, 32, "step", "distilling the scales, step 5 of 32, ETA 20s", 20.0)]
    app, _ = make_app(tmp_path, engine, load=loader(engine, script, block=gate))
    async with app.run_test(size=(80, 24)) as pilot:
        try:
            await wait_until(lambda: isinstance(app.screen, LoadingScreen) and app.screen.query("#quantize-detail")
                             and "distilling" in str(app.screen.query_one("#quantize-detail").render()))
            detail = str(app.screen.query_one("#quantize-detail").render())
            assert detail == "distilling the scales, step 5 of 32, ETA 20s", detail
        finally:
            gate.set()
        await wait_until(lambda: app.engine is engine)
        await pilot.pause()


async def test_error_shows_what_to_do_and_retry_works(tmp_path):
    engine = FakeEngine()
    attempts = []

    def flaky(progress):
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("Failed to resolve 'huggingface.co'")
        return engine

    app, _ = make_app(tmp_path, engine, load=flaky)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(lambda: isinstance(app.screen, LoadingScreen) and app.screen.has_class("-failed"))
        text = str(app.screen.query_one("#loading-error").render())
        assert "Failed to resolve" in text and "HF_HUB_OFFLINE=1" in text and "Press r to retry" in text
        await pilot.press("r")
        await wait_until(lambda: app.engine is engine and not isinstance(app.screen, LoadingScreen))


def test_hints_and_units():
    assert "smaller model" in error_hint(MemoryError())
    assert "--model" in error_hint(FileNotFoundError("no such file: x.gguf"))
    assert human_bytes(1_870) == "1.9 KB" and human_bytes(512) == "512 B"
