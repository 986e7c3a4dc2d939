"""Snapshots of the main screens at 80x24 and 120x40, over the fake engine (fixed output, no clock).

Update after an intended change with: pytest tests/test_app_snapshots.py --snapshot-update
"""

from __future__ import annotations

import threading

import pytest
from app_support import make_app, ready, send, wait_until
from fake_engine import FakeEngine, loader

from parley.app.chat_app import ParleyApp
from parley.app.screens.help import HelpScreen
from parley.app.screens.loading import LoadingScreen
from parley.models.progress import Progress

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((120, 40), id="120x40")]
QUESTION = "How do I add two numbers in Python?"


class FirstRunApp(ParleyApp):
    """Holds the fake load open on the first-run screen; lets it go when the app closes."""

    gate = threading.Event()

    def on_unmount(self) -> None:
        self.gate.set()


async def _chat_with_reply(pilot) -> None:
    app = pilot.app
    await ready(app, pilot)
    app.prompt.cursor_blink = False
    await send(app, pilot, QUESTION)
    await wait_until(lambda: app.engine.calls and not app.generating)
    await pilot.pause()
    app.prompt.focus()
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES)
def test_chat_with_finished_reply(snap_compare, tmp_path, size):
    app, _ = make_app(tmp_path, FakeEngine())
    assert snap_compare(app, terminal_size=size, run_before=_chat_with_reply)


@pytest.mark.parametrize("size", SIZES)
def test_sliders_panel_open(snap_compare, tmp_path, size):
    app, _ = make_app(tmp_path, FakeEngine())

    async def run_before(pilot) -> None:
        await _chat_with_reply(pilot)
        await pilot.press("f2", "right", "right")  # temperature 0.70 -> 0.80, shown as applied
        panel = pilot.app.panel
        await wait_until(lambda: "temperature = 0.8" in str(panel.query_one("#applied").render()))
        await wait_until(lambda: not panel.has_class("-flash"))  # the flash ends on its own timer
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_first_run_progress(snap_compare, tmp_path, size):
    engine = FakeEngine()
    script = [
        Progress("download", 988e6, 988e6, "B", "model.safetensors"),
        Progress("quantize", 12, 30, "layer", "layer 12/30", eta_s=40.0),
    ]
    gate = threading.Event()
    app, _ = make_app(tmp_path, engine, app_class=FirstRunApp, load=loader(engine, script, block=gate))
    app.gate = gate

    async def run_before(pilot) -> None:
        await wait_until(lambda: isinstance(pilot.app.screen, LoadingScreen))
        await wait_until(lambda: pilot.app.screen.query("#quantize-detail")
                         and "layer 12" in str(pilot.app.screen.query_one("#quantize-detail").render()))
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_help_screen(snap_compare, tmp_path, size):
    app, _ = make_app(tmp_path, FakeEngine())

    async def run_before(pilot) -> None:
        await ready(pilot.app, pilot)
        pilot.app.prompt.cursor_blink = False
        await pilot.press("f1")
        await wait_until(lambda: isinstance(pilot.app.screen, HelpScreen))
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=run_before)
