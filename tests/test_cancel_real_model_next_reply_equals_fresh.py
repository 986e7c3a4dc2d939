"""On the real model (INT4 default engine and fp32): a reply cancelled at a random point leaves an
engine whose next reply, at temperature 0, equals a fresh engine's reply to the same visible history
(the cancelled text as the assistant's message), at seeded random points. The cache must hold exactly
the prompt and the tokens shown when the cancel landed. The 200-point figure of issue 14 is
`parley bench faults --only cancel` (README); this test runs fewer so the suite holds on a busy machine."""

import random
from dataclasses import replace

import pytest
from real_engines import QUANTS, fresh, snippet
from replies import collect

from parley.engine.params import GenerationParams

pytestmark = pytest.mark.slow
# fp32 shares the native step (same arithmetic, other weight form), so it runs fewer.
POINTS_BY_QUANT = {"awq": 40, "none": 10}
SEED = 30
FIRST = GenerationParams(temperature=0.8, max_new_tokens=16, speculation="auto", seed=0)
NEXT = GenerationParams(temperature=0, max_new_tokens=8, speculation="off")


@pytest.mark.parametrize("quant", QUANTS)
def test_cancel_at_random_points_then_next_reply_equals_fresh(quant):
    POINTS = POINTS_BY_QUANT[quant]
    rng = random.Random(SEED)
    eng = fresh(quant)
    mismatches, cancelled = [], 0
    for i in range(POINTS):
        first = [{"role": "user", "content": snippet(rng)}]
        at = rng.randint(1, 12)  # cancel once this many deltas have been shown
        shown, done = collect(eng, first, replace(FIRST, seed=i), lambda _text, n, at=at: n >= at)
        cancelled += done.reason == "cancelled"
        visible = [*first, {"role": "assistant", "content": shown}, {"role": "user", "content": "Go on."}]
        if collect(eng, visible, NEXT) != collect(fresh(quant), visible, NEXT):
            mismatches.append((i, at))
    print(f"{quant}: {cancelled} of {POINTS} replies cancelled mid-stream; {len(mismatches)} mismatches")
    assert cancelled > POINTS // 2
    assert not mismatches, (f"{quant} (seed {SEED}): after {len(mismatches)} of {POINTS} cancels the next reply "
                            f"differs from a fresh engine's (point, deltas shown): {mismatches[:20]}")
