"""First run: chat at once on the unquantized model while AWQ runs; switch to INT4 between replies."""

from __future__ import annotations

import threading

import pytest
from app_support import make_app, notices, ready, send, wait_until
from fake_engine import FakeEngine

from parley.app.first_run import QuantizeInBackground
from parley.app.screens.loading import LoadingScreen
from parley.models.progress import Progress

pytestmark = pytest.mark.anyio


class ScriptedLoads:
    """`load(quant, progress)`: "awq" reports quantization and waits for `finish`; "none" returns at once."""

    def __init__(self, cached: bool = False) -> None:
        self.fp = FakeEngine(replies=["from the fp model"], model_name="smol", quantization="none")
        self.int4 = FakeEngine(replies=["from the INT4 model"], model_name="smol", quantization="awq-int4")
        self.cached = cached
        self.finish = threading.Event()
        self.loads: list[str] = []

    def __call__(self, quant: str, progress):
        self.loads.append(quant)
        if quant == "none":
            return self.fp
        if not self.cached:
            for layer in range(1, 4):
                progress(Progress("quantize", layer, 30, "layer", f"layer {layer}/30"))
            assert self.finish.wait(timeout=30), "the test never let the quantization finish"
        return self.int4


def test_cached_int4_is_used_directly():
    loads = ScriptedLoads(cached=True)
    loader = QuantizeInBackground(loads)
    assert loader.load(None) is loads.int4
    assert loader.upgrade(None) is None and loads.loads == ["awq"]


def test_quantizing_returns_the_fp_model_then_int4():
    loads = ScriptedLoads()
    loader = QuantizeInBackground(loads)
    seen = []
    assert loader.load(seen.append) is loads.fp  # without waiting for the quantization
    assert seen == []  # quantization progress does not go to the first-run screen
    loads.finish.set()
    later = []
    assert loader.upgrade(later.append) is loads.int4
    assert later and later[0].stage == "quantize"


def test_a_failed_quantization_is_raised_by_upgrade():
    def load(quant, progress):
        if quant == "none":
            return FakeEngine()
        progress(Progress("quantize", 0, 30, "layer"))
        raise OSError(28, "No space left on device")

    loader = QuantizeInBackground(load)
    loader.load(None)
    with pytest.raises(OSError, match="No space"):
        loader.upgrade(None)


async def test_chat_starts_on_fp_and_switches_to_int4_between_replies(tmp_path):
    loads = ScriptedLoads()
    loads.fp.hold_at = 1  # the first reply is still streaming when INT4 becomes ready
    loader = QuantizeInBackground(loads)
    app, _ = make_app(tmp_path, load=loader.load, upgrade_engine=loader.upgrade)
    async with app.run_test(size=(120, 30)) as pilot:
        await ready(app, pilot)
        assert not isinstance(app.screen, LoadingScreen)  # no wait for the quantization
        assert app.engine is loads.fp and "smol · full precision" in str(app.status.render())
        await wait_until(lambda: "making INT4: layer 3 of 30" in str(app.status.render()))
        await send(app, pilot, "hi")
        await wait_until(loads.fp.holding.is_set)
        loads.finish.set()
        await wait_until(lambda: app.engines.next_engine is loads.int4)
        assert app.engine is loads.fp  # never mid-reply
        loads.fp.release.set()
        await wait_until(lambda: app.engine is loads.int4 and not app.generating)
        assert app.chat.messages[-1].content == "from the fp model"
        assert await notices(app, "Switched to smol · INT4 (AWQ)")
        assert "smol · INT4 (AWQ)" in str(app.status.render())
        await send(app, pilot, "again")
        await wait_until(lambda: loads.int4.calls and not app.generating)
        # The INT4 engine reads the whole conversation, the fp model's reply included.
        assert [m["content"] for m in loads.int4.calls[0].messages] == ["hi", "from the fp model", "again"]


async def test_plain_load_shows_no_progress_screen_and_says_it_is_loading(tmp_path):
    gate = threading.Event()
    engine = FakeEngine()

    def load(progress):
        progress(Progress("load", 0, 0, "", "reading model.gguf"))
        gate.wait(timeout=30)
        return engine

    app, _ = make_app(tmp_path, engine, load=load)
    async with app.run_test(size=(100, 24)) as pilot:
        try:
            await wait_until(lambda: "reading model.gguf" in str(app.status.render()))
            assert not isinstance(app.screen, LoadingScreen) and app.prompt.has_focus
            await pilot.press("h", "i", "enter")  # sent while loading: queued, answered once the model is in
            await wait_until(lambda: [m.content for m in app.chat.messages] == ["hi"])
        finally:
            gate.set()
        await wait_until(lambda: app.engine is engine)
        await wait_until(lambda: engine.calls and not app.generating)


def test_a_model_too_large_to_stand_in_waits_on_the_first_run_screen():
    """An 8B model's unquantized weights do not fit beside the quantizer in 24 GiB: no stand-in is loaded
    (it would be killed for memory); the first-run screen gets the reason and the quantization's progress,
    ETA included, and the INT4 engine is the first one."""
    loads = ScriptedLoads()
    loader = QuantizeInBackground(loads, stand_in=lambda: "the unquantized model needs 17.1 GiB")
    seen = []
    threading.Timer(0, loads.finish.set).start()
    assert loader.load(seen.append) is loads.int4
    assert loads.loads == ["awq"], "no stand-in may be loaded"
    assert "needs 17.1 GiB" in seen[0].detail and "the chat opens when INT4 is ready" in seen[0].detail
    assert [p.detail for p in seen[1:]][-1] == "layer 3/30"
    assert loader.upgrade(None) is None
