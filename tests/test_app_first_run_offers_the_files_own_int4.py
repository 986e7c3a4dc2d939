"""First run of a .gguf whose weights already are 4-bit: the chat starts at once on those weights on the
INT4 kernels (--quant gguf, nothing quantized), the app says which weights run and offers the choice: keep
them (nothing is ever quantized) or make Parley's INT4 in the background and switch to it between replies.
The answer is remembered per model; other models start as before (unquantized while INT4 is made)."""

from __future__ import annotations

import threading

import pytest
from app_support import make_app, notices, ready, wait_until
from fake_engine import FakeEngine

from parley.app.first_run import CHOICE_KEY, QuantizeInBackground, four_bit_gguf
from parley.app.screens.weights_choice import WeightsChoiceScreen
from parley.app.widgets.status_bar import quantization_words
from parley.models.progress import Progress

pytestmark = pytest.mark.anyio


class Loads:
    def __init__(self) -> None:
        self.fp = FakeEngine(replies=["fp"], model_name="smol", quantization="none")
        self.own = FakeEngine(replies=["own"], model_name="smol", quantization="gguf-int4:Q4_1")
        self.int4 = FakeEngine(replies=["int4"], model_name="smol", quantization="awq-int4")
        self.finish, self.loads = threading.Event(), []

    def __call__(self, quant: str, progress):
        self.loads.append(quant)
        if quant == "none":
            return self.fp
        if quant == "gguf":
            return self.own
        progress(Progress("quantize", 1, 30, "layer", "layer 1/30"))
        assert self.finish.wait(timeout=30), "the test never let the quantization finish"
        return self.int4


def test_the_status_words_name_the_files_own_weights():
    assert quantization_words("gguf-int4:Q4_1") == "INT4 (the file's own Q4_1)"
    words = quantization_words("gguf-int4:Q4_K + Q5_0, Q6_K rounded")
    assert words == "INT4 (the file's own Q4_K + Q5_0, Q6_K rounded)"


def test_the_embedded_model_is_found_4_bit():
    assert four_bit_gguf(None) == "Q4_1"
    assert four_bit_gguf("org/some-model") is None


def test_keeping_the_files_weights_never_quantizes():
    loads = Loads()
    loader = QuantizeInBackground(loads, file_weights="Q4_1")
    assert loader.load(None) is loads.own and loader.offer == "Q4_1"
    loader.choose("gguf")
    assert loader.upgrade(None) is None and loads.loads == ["gguf"]


def test_a_remembered_choice_is_not_asked_again():
    loads = Loads()
    keep = QuantizeInBackground(loads, file_weights="Q4_1", choice="gguf")
    assert keep.load(None) is loads.own and keep.offer is None and keep.upgrade(None) is None
    loads.finish.set()
    loads = Loads()
    make = QuantizeInBackground(loads, file_weights="Q4_1", choice="awq")
    assert make.load(None) is loads.own and make.offer is None  # the stand-in while Parley's INT4 is made
    loads.finish.set()
    assert make.upgrade(None) is loads.int4


def test_other_models_start_unquantized_while_int4_is_made():
    loads = Loads()
    loader = QuantizeInBackground(loads, file_weights=lambda: None)
    assert loader.load(None) is loads.fp
    loads.finish.set()
    assert loader.upgrade(None) is loads.int4


@pytest.mark.parametrize("key", ["k", "m"])
async def test_the_app_says_which_weights_run_and_offers_the_choice(tmp_path, key):
    loads = Loads()
    loader = QuantizeInBackground(loads, file_weights="Q4_1")
    app, _ = make_app(tmp_path, load=loader.load, upgrade_engine=loader.upgrade, first_run=loader)
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_until(lambda: isinstance(app.screen, WeightsChoiceScreen))
        assert app.engines.engine is loads.own
        assert "smol · INT4 (the file's own Q4_1)" in str(app.status.render())
        assert await notices(app, "the file's own 4-bit weights")
        await pilot.press(key)
        await ready(app, pilot)
        assert app.settings.get(CHOICE_KEY) == {"(default)": "gguf" if key == "k" else "awq"}
        if key == "k":
            assert loads.loads == ["gguf"] and app.engine is loads.own
            return
        loads.finish.set()
        await wait_until(lambda: app.engine is loads.int4)
        assert await notices(app, "Switched to smol · INT4 (AWQ)")
