"""The real embedded model's engines for the exactness tests, loaded once per test process: the
default INT4 (AWQ, quantized into the test cache on first use) and fp32. Each test gets engines that
share those weights with caches of their own (`fresh`).

The INT4 weights come through the path a first run takes (`ensure_quantized`, then `Engine.load` of the
cached folder: same AWQ search, packing, native step), calibrated on 4 x 128 tokens of the built-in
corpus instead of a user's 32 x 256: exactness is a property of the engine's code, not of how good the
weights are, and the smaller set quantizes in a fraction of the time (minutes on a busy machine)."""

from __future__ import annotations

import functools
import os
import random
from importlib import resources

import pytest

from parley.engine.engine import Engine
from parley.models.quantize.cache import ensure_quantized
from parley.models.resolve import resolve

QUANTS = ["awq", "none"]  # the default engine first


TEST_CALIBRATION = {"calib": "builtin", "n_samples": 4, "seq_len": 128}


def int4_path() -> str:
    """The tests' INT4 folder, quantized once a run by whichever test asks first: in the cache that all of a run's
    workers share (conftest), not in the asking test's own, where every worker would quantize it again."""
    with pytest.MonkeyPatch.context() as mp:
        if shared := os.environ.get("PARLEY_TEST_SHARED_CACHE"):
            mp.setenv("PARLEY_CACHE_DIR", shared)
        return str(ensure_quantized(resolve(None), **TEST_CALIBRATION).path)


@functools.cache
def loaded(quant: str) -> Engine:
    return Engine.load(int4_path() if quant == "awq" else None, quant=quant, device="cpu", context_window=256)


def fresh(quant: str, context_window: int = 1024, draft=None, parallel: int | None = None,
          kv_cache: str | None = None) -> Engine:
    """An engine on the real model's weights with an empty KV pool (`parallel` slots: default 4), its caches
    stored as `kv_cache` when given."""
    eng = loaded(quant).fresh(context_window=context_window, draft=draft, parallel=parallel or 4)
    if kv_cache is not None:
        eng.set_kv_cache(kv_cache)
    return eng


def heldout(name: str) -> str:
    return resources.files("parley").joinpath(f"assets/heldout/{name}").read_text()


def snippet(rng: random.Random, lo: int = 20, hi: int = 200) -> str:
    """A random stretch of held-out text (essays or Python docs), cut at word boundaries."""
    text = heldout(rng.choice(["essays.txt", "python_reference.txt", "python_stdlib.txt"]))
    start = rng.randrange(len(text) - hi)
    piece = text[start : start + rng.randint(lo, hi)]
    return piece.split(" ", 1)[-1].rsplit(" ", 1)[0].strip() or piece
