"""The PyTorch path shares passes between sequences (PARLEY_SHARED_PASSES=1, what a GPU server would run): decode
and verification rows of several sequences go through one pass of exactly ROW_TILE rows, each sequence attending its
own cache, and each sequence's logits are bitwise those of its pass alone (which is a ROW_TILE-row pass too): fp32
and INT4 weights (the Int4Linear modules and the int8 head a GPU runs, here on their CPU kernels), every KV cache
type. Then whole replies: four clients at once, greedy, seeded sampling and speculation, each bitwise its solo text."""

from __future__ import annotations

import functools
import random
import threading

import pytest
import torch
from real_engines import TEST_CALIBRATION, heldout

from parley.engine import cached_model
from parley.engine.cached_model import ROW_TILE, forward_batch
from parley.engine.engine import Engine
from parley.engine.events import consume
from parley.engine.params import GenerationParams
from parley.models.quantize.cache import ensure_quantized
from parley.models.resolve import resolve
from parley.models.transformer import KV_CACHE_TYPES

pytestmark = pytest.mark.slow


@functools.cache
def torch_engine(quant: str) -> Engine:
    ref = str(ensure_quantized(resolve(None), **TEST_CALIBRATION).path) if quant == "awq" else None
    return Engine.load(ref, quant=quant, device="cpu", native=False, context_window=256)


def engine(quant: str, kind: str, parallel: int, monkeypatch) -> Engine:
    monkeypatch.setenv("PARLEY_SHARED_PASSES", "1")
    eng = torch_engine(quant).fresh(context_window=512, parallel=parallel)
    eng.set_kv_cache(kind)
    return eng


@pytest.mark.parametrize("kind", KV_CACHE_TYPES)
@pytest.mark.parametrize("quant", ["none", "awq"])
def test_each_sequence_of_a_shared_pass_gets_its_logits_alone(quant: str, kind: str, monkeypatch) -> None:
    seed = 11 + KV_CACHE_TYPES.index(kind)
    rng = random.Random(seed)
    eng = engine(quant, kind, 3, monkeypatch)
    essay = heldout("essays.txt")
    slots = []
    for _ in range(3):  # three sequences of different lengths, each in its own slot
        start = rng.randrange(len(essay) - 800)
        ids = eng.tokenizer.encode(essay[start : start + rng.randrange(100, 700)])
        slot = eng.pool.take(ids)
        slot.sync(ids)
        slots.append(slot)
    assert all(s.row_tile == ROW_TILE for s in slots)
    vocab = eng.tokenizer.vocab_size
    for lengths in ([1, 1, 1], [1, 6, 9], [16, 1], [4, 12]):  # one tile, a full tile, a second tile
        parts = [(slot, [rng.randrange(vocab) for _ in range(n)], None, rng.randrange(n))
                 for slot, n in zip(slots, lengths, strict=False)]
        alone = [forward_batch([p])[0] for p in parts]
        shared = forward_batch(parts)
        for i, (a, b) in enumerate(zip(alone, shared, strict=True)):
            assert torch.equal(a, b), f"seed {seed}, {quant}, {kind}: sequence {i} of a pass of {lengths} rows"


QUESTIONS = ("Write a long story about a lighthouse keeper.", "Name three colours.",
             "What is the capital of Portugal, and one fact about it?", "Suggest a quick vegetarian lunch.")


@pytest.mark.parametrize("kind", KV_CACHE_TYPES)
def test_clients_at_once_get_their_solo_replies(kind: str, monkeypatch) -> None:
    seed = 21 + KV_CACHE_TYPES.index(kind)
    params = [GenerationParams(temperature=0, max_new_tokens=24, speculation="off"),
              GenerationParams(temperature=0.8, top_p=0.9, seed=seed, max_new_tokens=20, speculation="suffix"),
              GenerationParams(temperature=0, max_new_tokens=28, speculation="prompt-lookup"),
              GenerationParams(temperature=0.7, seed=seed + 1, repeat_penalty=1.1, max_new_tokens=22,
                               speculation="auto")]
    messages = [[{"role": "user", "content": q}] for q in QUESTIONS]
    solo_engine = engine("none", kind, 1, monkeypatch)
    solo = [consume(solo_engine.session().reply(m, p)).text for m, p in zip(messages, params, strict=True)]

    shared = engine("none", kind, 4, monkeypatch)
    results: list = [None] * 4
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(
        i, consume(shared.session().reply(messages[i], params[i]))), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
        assert not t.is_alive()
    for i, (r, text) in enumerate(zip(results, solo, strict=True)):
        assert r.done.reason in ("length", "eos") and r.text == text, f"seed {seed}, {kind}: client {i}"
    assert max(shared.scheduler.pass_sizes) > 1, "no pass was shared"
    assert cached_model.shared_passes()
