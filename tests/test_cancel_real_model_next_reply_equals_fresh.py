"""On the real model (INT4 default engine and fp32): a reply cancelled at a random point leaves an
engine whose next reply, at temperature 0, equals a fresh engine's reply to the same visible history
(the cancelled text as the assistant's message), at seeded random points. The cache must hold exactly
the prompt and the tokens shown when the cancel landed. The 200-point figure of issue 14 is
`parley bench faults --only cancel` (docs/performance.md); this test runs fewer so the suite holds on a busy machine."""

import pytest
from real_engines import QUANTS, fresh

from parley.bench.faults import cancel_check

pytestmark = pytest.mark.slow
# fp32 shares the native step (same arithmetic, other weight form), so it runs fewer.
POINTS_BY_QUANT = {"awq": 40, "none": 10}
SEED = 30


@pytest.mark.parametrize("quant", QUANTS)
def test_cancel_at_random_points_then_next_reply_equals_fresh(quant):
    """The bench's own check (sampled first replies with speculation, cancelled after 1..12 shown deltas;
    then a temperature-0 reply against a fresh engine on the same weights), on fewer points."""
    points = POINTS_BY_QUANT[quant]
    result = cancel_check(fresh(quant), points, SEED, say=print)
    print(f"{quant}: {result}")
    assert result["cancelled"] > points // 2, f"seed {SEED}: {result}"
    assert result["mismatches"] == 0, (f"{quant} (seed {SEED}): after {result['mismatches']} of {points} cancels "
                                       f"the next reply differs from a fresh engine's (point, deltas shown): "
                                       f"{result['mismatch_points']}")
