"""On the real model (INT4 default engine and fp32), the logits of a position are bitwise identical
however the position is computed: in a 1-token pass, anywhere inside a k+1-token verification pass
(k+1 = 1..17), inside a prefill chunk; and whatever computed the earlier positions' KV (a prefill
chunk, 1-token decode passes, verification passes of varying lengths). Context lengths cross the
256-slot window bucket and the 512-token prefill chunk.

This is what makes speculation and prefix reuse exact: if it fails, a greedy reply can change with
the draft length, and a reply on a reused prefix can differ from a fresh engine's (issue 10)."""

import random

import pytest
import torch
from real_engines import QUANTS, fresh, heldout

pytestmark = pytest.mark.slow
LENGTHS = [40, 250, 255, 256, 257, 300, 511, 512, 513, 700]
SEED = 10


def document_ids() -> list[int]:
    return fresh("none", 64).tokenizer.encode(heldout("essays.txt") + heldout("python_reference.txt"))[:800]


def logits_at(cached, ids: list[int], p: int, start: int, length: int, history: str, rng) -> torch.Tensor:
    """Logits of position p from a pass over [start, start + length) (which contains p), after the
    positions before `start` were cached by `history`: 'prefill' (chunks), 'decode' (the last 24 in
    1-token passes) or 'verify' (the last 24 in passes of 2..17 tokens, partly committed). The cache
    already holds a prefix of `ids` from prefill chunks: `sync` only rolls back to what it needs."""
    tail = 24 if history != "prefill" else 0
    cached.sync(ids[: max(0, start - tail)])
    while len(cached.ids) < start:
        n = 1 if history == "decode" else rng.randint(2, 17)
        chunk = ids[len(cached.ids) : len(cached.ids) + n]
        cached.forward(chunk)
        cached.commit(min(len(chunk), start - len(cached.ids), rng.randint(1, len(chunk))))
    return cached.forward(ids[start : start + length])[p - start]


@pytest.mark.parametrize("quant", QUANTS)
def test_logits_of_a_position_do_not_depend_on_the_pass(quant):
    ids = document_ids()
    rng = random.Random(SEED)
    cached = fresh(quant).target
    failures = []
    # every length on the default engine; the bucket edge on fp32 (the same native step, 4x the bytes)
    for p in (LENGTHS if quant == "awq" else [255, 256, 257]):
        cached.rollback(0)  # a clean start: every earlier position's KV from prefill chunks
        cached.sync(ids[:p])
        want = cached.forward(ids[p : p + 1])[0]  # the reference: a 1-token pass after a prefill
        ways = [(f"verify pass of {n} at offset {o}", p - o, n, "prefill")
                for n in range(1, 18) for o in sorted({0, n - 1, rng.randrange(n)})]
        ways += [(f"{h} history, then a pass of {n}", p - o, n, h)
                 for h in ("decode", "verify") for n, o in ((1, 0), (5, 2), (17, 16))]
        ways += [("ending a prefill chunk", max(0, p - 300), p + 1 - max(0, p - 300), "prefill"),
                 ("inside a prefill chunk", max(0, p - 300), p + 51 - max(0, p - 300), "prefill")]
        for name, start, n, history in ways:
            got = logits_at(cached, ids, p, start, n, history, rng)
            if not torch.equal(got, want):
                failures.append(f"position {p}, {name}: max |diff| {float((got - want).abs().max()):.3g}, "
                                f"argmax {int(got.argmax())} vs {int(want.argmax())}")
        # the prefill path itself: last_only logits of a chunk ending at p
        cached.sync(ids[: max(0, p - 100)])
        got = cached.forward(ids[max(0, p - 100) : p + 1], last_only=True)[-1]
        if not torch.equal(got, want):
            diff = float((got - want).abs().max())
            failures.append(f"position {p}, the last_only row of a prefill chunk: max |diff| {diff:.3g}")
    assert not failures, f"{quant} (seed {SEED}): {len(failures)} ways differ:\n" + "\n".join(failures[:40])
