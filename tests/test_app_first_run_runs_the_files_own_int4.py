"""First run of a .gguf whose weights already are 4-bit: the chat starts on those weights on the INT4
kernels (--quant gguf, nothing quantized) instead of the unquantized model while Parley's INT4 is made,
says which weights run, and switches to Parley's INT4 between replies; other models start unquantized."""

from __future__ import annotations

import threading

import pytest
from app_support import make_app, notices, ready, wait_until
from fake_engine import FakeEngine

from parley.app.first_run import QuantizeInBackground
from parley.app.widgets.status_bar import quantization_words
from parley.models.errors import ModelLoadError
from parley.models.progress import Progress

pytestmark = pytest.mark.anyio


class Loads:
    def __init__(self, gguf_ok: bool = True) -> None:
        self.fp = FakeEngine(replies=["fp"], model_name="smol", quantization="none")
        self.own = FakeEngine(replies=["own"], model_name="smol", quantization="gguf-int4:Q4_1")
        self.int4 = FakeEngine(replies=["int4"], model_name="smol", quantization="awq-int4")
        self.gguf_ok, self.finish, self.loads = gguf_ok, threading.Event(), []

    def __call__(self, quant: str, progress):
        self.loads.append(quant)
        if quant == "none":
            return self.fp
        if quant == "gguf":
            if not self.gguf_ok:
                raise ModelLoadError("model.safetensors: not a .gguf file")
            return self.own
        progress(Progress("quantize", 1, 30, "layer", "layer 1/30"))
        assert self.finish.wait(timeout=30), "the test never let the quantization finish"
        return self.int4


def test_the_status_words_name_the_files_own_weights():
    assert quantization_words("gguf-int4:Q4_1") == "INT4 (the file's own Q4_1)"
    assert quantization_words("gguf-int4:Q4_K + Q5_0, Q6_K rounded") == "INT4 (the file's own Q4_K + Q5_0, Q6_K rounded)"


def test_a_4_bit_gguf_starts_on_its_own_weights_then_parleys_int4():
    loads = Loads()
    loader = QuantizeInBackground(loads, file_int4_first=True)
    assert loader.load(None) is loads.own
    loads.finish.set()
    assert loader.upgrade(None) is loads.int4
    assert sorted(loads.loads) == ["awq", "gguf"]


def test_a_model_that_is_not_a_4_bit_gguf_starts_unquantized():
    loads = Loads(gguf_ok=False)
    loader = QuantizeInBackground(loads, file_int4_first=True)
    assert loader.load(None) is loads.fp
    loads.finish.set()
    assert loader.upgrade(None) is loads.int4


async def test_the_app_says_which_weights_run(tmp_path):
    loads = Loads()
    loader = QuantizeInBackground(loads, file_int4_first=True)
    app, _ = make_app(tmp_path, load=loader.load, upgrade_engine=loader.upgrade)
    async with app.run_test(size=(120, 30)) as pilot:
        await ready(app, pilot)
        assert app.engine is loads.own
        assert "smol · INT4 (the file's own Q4_1)" in str(app.status.render())
        assert await notices(app, "the file's own 4-bit weights")
        loads.finish.set()
        await wait_until(lambda: app.engine is loads.int4)
        assert await notices(app, "Switched to smol · INT4 (AWQ)")
