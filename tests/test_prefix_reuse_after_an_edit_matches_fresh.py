"""A context that departs from the cached one mid-way (an edited earlier turn) reuses exactly the common prefix:
the logits after it equal a fresh prefill's, at every point of departure.

The turn-after-turn tests only ever extend the cache (the whole cache is the common prefix), so a reuse of
one token too many at the point of departure would pass them; here it keeps a wrong token's K/V."""

import random

import torch
from tiny import tiny_engine


def test_logits_after_a_departure_equal_a_fresh_prefill():
    seed = 5
    rng = random.Random(seed)
    eng = tiny_engine()
    cached = [rng.randrange(3, 200) for _ in range(40)]
    for split in (1, 7, 20, 39):
        eng.prefill(cached)
        edited = cached[:split] + [(cached[split] + 1 + rng.randrange(50)) % 200 + 3] + cached[split + 1:]
        assert eng.prefill(edited[:-1]) == split, f"seed={seed} split={split}: the reuse is not the common prefix"
        got = eng.forward(edited[-1:])
        fresh = tiny_engine()
        fresh.prefill(edited[:-1])
        want = fresh.forward(edited[-1:])
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"seed={seed} split={split}")
