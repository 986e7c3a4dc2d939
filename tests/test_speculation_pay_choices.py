"""The pass-cost model and the choices made from it: how many guesses to verify, and when `auto`
declares drafting slower than plain decoding. Fed measured seconds directly (no clock)."""

import pytest

from parley.engine.speculation_pay import PRIOR_SLOPE, PassCost, PayCheck, best_length


def cost(base: float, slope: float) -> PassCost:
    c = PassCost()
    c.add(1, base)
    c.add(5, base + 4 * slope)
    return c


def test_cost_ratio_is_measured_and_has_a_prior():
    assert PassCost().ratio(9) == pytest.approx(1 + 8 * PRIOR_SLOPE)
    c = PassCost()
    c.add(9, 0.018)  # a long round before any 1-token round is kept until one is timed
    assert c.slope is None
    c.add(1, 0.010)
    assert c.ratio(9) == pytest.approx(1.8)


def test_best_length_trades_expected_tokens_for_pass_cost():
    scores = [1.0, 0.9, 0.5, 0.2, 0.1]
    assert best_length(scores, cost(1.0, 0.0)) == 5  # passes of any length cost the same: verify all
    # each guess costs 0.4 of a pass: rate(n) = (1 + sum(scores[:n])) / (1 + 0.4 n): 1, 1.43, 1.61, 1.55, 1.38
    assert best_length(scores, cost(1.0, 0.4)) == 2
    assert best_length(scores, cost(1.0, 2.0)) == 0  # guesses dearer than they can return
    assert best_length(scores, cost(1.0, 0.4), calibration=0.2) == 0  # guesses have landed too rarely
    assert best_length([], cost(1.0, 0.0)) == 0


def test_paycheck_turns_drafting_off_only_when_slower_than_plain():
    c = cost(1.0, 0.3)
    slow, fast = PayCheck(c, min_rounds=4), PayCheck(c, min_rounds=4)
    slow.add(drafted=4, tokens=5, seconds=100.0)  # the first drafted round (indexing the prompt) is not judged
    fast.add(drafted=4, tokens=1, seconds=100.0)
    for _ in range(4):
        assert slow.pays() and fast.pays()  # no verdict before min_rounds drafted rounds
        slow.add(drafted=4, tokens=1, seconds=2.2)  # 1 token per 2.2 plain-round times
        fast.add(drafted=4, tokens=4, seconds=2.2)
    assert not slow.pays() and "turned off" in slow.note and "0.45x" in slow.note
    assert fast.pays() and fast.note == ""
    slow.add(drafted=4, tokens=5, seconds=1.0)
    assert not slow.pays()  # off stays off for the rest of the reply


def test_paycheck_asks_for_a_plain_round_to_compare_with():
    check = PayCheck(PassCost(), min_rounds=2)
    check.add(drafted=3, tokens=1, seconds=1.0)
    check.add(drafted=3, tokens=1, seconds=1.0)
    assert not check.needs_plain_round
    check.add(drafted=3, tokens=1, seconds=1.0)
    assert check.needs_plain_round and check.pays()  # no verdict without a measured plain round
