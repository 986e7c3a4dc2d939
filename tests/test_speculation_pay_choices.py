"""The pass-cost model and the choices made from it: how many guesses to verify, and when `auto`
declares drafting slower than plain decoding. Fed measured seconds directly (no clock)."""

import pytest

from parley.engine.scheduler import Guesses, share_guesses
from parley.engine.speculation_pay import PRIOR_SLOPE, PassCost, PayCheck


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


def best_length(scores: list[float], cost: PassCost, calibration: float = 1.0) -> int:
    """How many guesses a reply alone in its pass verifies (`least` 0: none when none pays)."""
    return share_guesses([Guesses([min(1.0, s * calibration) for s in scores])], rows=1, tokens=1, cost=cost)[0]


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
        # drafting 0.2 + a 5-token pass 2.2: each round costs 2.4 plain rounds
        slow.add(drafted=4, tokens=1, seconds=0.2)
        fast.add(drafted=4, tokens=4, seconds=0.2)
    assert not slow.pays() and "paused" in slow.note and "0.42x" in slow.note, slow.note
    assert fast.pays() and fast.note == ""
    for _ in range(15):
        slow.add(drafted=0, tokens=1, seconds=0.0)
        assert not slow.pays()  # paused: 16 plain rounds before the drafter is tried again
    slow.add(drafted=0, tokens=1, seconds=0.0)
    assert slow.pays() and slow.note == "" and slow.rounds == 0  # tried again, judged afresh


def test_paycheck_judges_the_recent_rounds_not_the_whole_reply():
    check = PayCheck(cost(1.0, 0.3), min_rounds=4, window=6)
    check.add(drafted=4, tokens=5, seconds=1.0)  # not judged
    for _ in range(20):  # a long quote: 5 tokens per round of 2.4 plain rounds
        check.add(drafted=4, tokens=5, seconds=0.2)
        assert check.pays()
    free = 0  # then free text: 1 token per 2.4; the whole reply would still pay, the last 6 rounds do not
    while free < 6 and check.pays():
        check.add(drafted=4, tokens=1, seconds=0.2)
        free += 1
    assert free == 4 and "paused" in check.note, free  # the last 6 rounds: 2 quoted + 4 free = 14 in 14.4


def test_stalled_rounds_move_neither_the_cost_fit_nor_the_verdict():
    """A busy neighbour makes some passes and some drafting 30x dearer: the medians, and so every ratio and
    verdict, stay those of the quiet rounds (a moving average or a windowed sum of seconds would follow)."""
    quiet, busy = PassCost(), PassCost()
    for i in range(12):
        for c in (quiet, busy):
            c.add(1, 1.0)
            c.add(9, 1.8)
        busy.add(1 if i % 2 else 9, 30.0)  # a stall after every pair of quiet passes
    assert busy.base == quiet.base == 1.0 and busy.ratio(9) == pytest.approx(quiet.ratio(9)) == pytest.approx(1.8)
    for drafted_tokens in (1, 4):  # guesses that do not pay, and guesses that do
        verdicts = []
        for stall in (1.0, 30.0):
            check = PayCheck(quiet, min_rounds=4)
            check.add(drafted=8, tokens=drafted_tokens, seconds=stall)  # a slow first round: not judged
            for i in range(12):
                check.add(drafted=8, tokens=drafted_tokens, seconds=stall if i % 3 == 0 else 0.01)
                check.add(drafted=0, tokens=1, seconds=stall if i % 4 == 0 else 0.0)  # plain rounds' overhead too
            verdicts.append(check.pays())
        assert verdicts == [drafted_tokens > 1.8] * 2, (drafted_tokens, verdicts)


def test_paycheck_asks_for_a_plain_round_to_compare_with():
    check = PayCheck(PassCost(), min_rounds=2)
    check.add(drafted=3, tokens=1, seconds=1.0)
    check.add(drafted=3, tokens=1, seconds=1.0)
    assert not check.needs_plain_round
    check.add(drafted=3, tokens=1, seconds=1.0)
    assert check.needs_plain_round and check.pays()  # no verdict without a measured plain round
