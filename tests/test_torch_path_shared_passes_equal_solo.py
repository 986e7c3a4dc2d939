"""The PyTorch path shares passes between sequences (PARLEY_SHARED_PASSES=1, what a GPU server would run): every row
of several sequences goes through passes of exactly ROW_TILE rows, each sequence attending its own cache, and each
sequence's logits are bitwise those of its pass alone (which is a ROW_TILE-row pass too): fp32 and INT4 weights (the
Int4Linear modules and the int8 head a GPU runs, here on their CPU kernels), every KV cache type. A prompt read in
any pieces (how the scheduler cut it, what a slot reused, how many guesses rode with its last rows) holds the same
K/V and gives the same logits. Then whole replies on the INT4 modules: four clients at once, greedy, seeded sampling
and speculation, each bitwise its solo text on a one-slot engine that served the others before it."""

from __future__ import annotations

import functools
import random
import threading

import pytest
import torch
from real_engines import heldout, int4_path

from parley.engine import cached_model
from parley.engine.cached_model import ROW_TILE, forward_batch
from parley.engine.engine import Engine
from parley.engine.events import consume
from parley.engine.params import GenerationParams
from parley.models.transformer import KV_CACHE_TYPES

pytestmark = pytest.mark.slow


@functools.cache
def torch_engine(quant: str) -> Engine:
    ref = int4_path() if quant == "awq" else None
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


@pytest.mark.parametrize("kind", KV_CACHE_TYPES)
@pytest.mark.parametrize("quant", ["none", "awq"])
def test_a_prompt_read_in_any_pieces_holds_the_same_kv_and_logits(quant: str, kind: str, monkeypatch) -> None:
    """Pieces of any length (a prefill chunk longer than a tile, a first round's prompt rows with guesses after
    them, a slot's reused prefix after another conversation, a prefix copied from another slot, as `parley serve`
    does for a shared system prompt): every position's K/V and each wanted row's logits
    are bitwise those of the prompt read whole. A row's products run at ROW_TILE rows whatever its piece, and its
    attention on its own, not in one product over its piece's rows under a window that ends with the piece."""
    seed = 31 + KV_CACHE_TYPES.index(kind)
    rng = random.Random(seed)
    essay = heldout("essays.txt")
    start = rng.randrange(len(essay) - 2000)
    eng = engine(quant, kind, 1, monkeypatch)
    ids = eng.tokenizer.encode(essay[start : start + 1000])[:150]
    other = ids[:40] + eng.tokenizer.encode(essay[start + 1000 : start + 1500])[:60]

    def read(cuts: list[int], before: list[int] | None = None, copied: bool = False):
        pool = engine(quant, kind, 2, monkeypatch).pool
        slot = pool.take(ids)
        if before:  # another conversation first: the slot keeps the prefix it shares with `ids`
            forward_batch([(slot, before, None, len(before))])
            slot.commit(len(before))
            slot.rollback(40)
        if copied:  # another slot read the first 60 tokens: their K/V are copied, not computed
            donor = pool.take(ids[:60])
            forward_batch([(donor, ids[:60], None, 60)])
            donor.commit(60)
            assert pool.share_prefix(slot, ids) == 60
        wanted, at = [], len(slot.ids)
        for end in [*cuts, len(ids)]:
            piece = ids[at:end]  # the last two rows' logits wanted, as a first round's pending token and guess
            wanted.extend(forward_batch([(slot, piece, None, max(0, len(piece) - 2))])[0])
            slot.commit(len(piece))
            at = end
        cache = slot.cache
        return wanted[-2:], [cache._read(i, w)[..., : len(ids), :] for i in range(cache.n_layers) for w in "kv"]

    whole_logits, whole_kv = read([])
    for cuts, before, copied in (([16, 32, 100], None, False), ([5, 21, 37, 149], None, False),
                                 ([57, 120], other, False), ([77], None, True)):
        logits, kv = read(cuts, before, copied)
        assert all(torch.equal(a, b) for a, b in zip(whole_logits, logits, strict=True)), \
            f"seed {seed}, {quant}, {kind}: logits differ when the prompt is read in pieces ending at {cuts}"
        assert all(torch.equal(a, b) for a, b in zip(whole_kv, kv, strict=True)), \
            f"seed {seed}, {quant}, {kind}: K/V differ when the prompt is read in pieces ending at {cuts}"


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
    solo_engine = engine("awq", kind, 1, monkeypatch)  # one slot: each reply reuses its prefix from the one before
    solo = [consume(solo_engine.session().reply(m, p)).text for m, p in zip(messages, params, strict=True)]

    shared = engine("awq", kind, 4, monkeypatch)
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
