"""How many guesses a pass verifies is decided across the batch from measured pass costs (`share_guesses`):
alone it is the single-reply rule (`best_length`, at least one guess); beside other replies every guess must
raise the whole pass's expected tokens per second, so each reply verifies fewer as the batch grows, the likeliest
guesses (whoever made them) first. The pass-cost model learns from shared passes alone (no 1-token pass)."""

from __future__ import annotations

import random

from parley.engine.scheduler import Guesses, share_guesses
from parley.engine.speculation_pay import PassCost


def best_length(scores: list[float], cost: PassCost) -> int:
    """The single-reply rule, written out as the reference: the n maximising (1 + expected accepted) /
    cost(1 + n), where the chance that the first i guesses all land is scores[i - 1]."""
    best_n, best_rate, expected = 0, 1.0, 1.0
    for n, score in enumerate(scores, start=1):
        expected += min(1.0, score)
        rate = expected / cost.ratio(1 + n)
        if rate > best_rate:
            best_n, best_rate = n, rate
    return best_n


def measured(base: float = 1.0, slope: float = 0.2, ones: bool = True) -> PassCost:
    cost = PassCost()
    for tokens in (1, 2, 4, 8, 16) if ones else (2, 4, 8, 16):
        for _ in range(3):
            cost.add(tokens, base + slope * (tokens - 1))
    return cost


def test_alone_it_is_the_single_reply_rule():
    rng = random.Random(7)
    cost = measured()
    for _ in range(200):
        scores = sorted((rng.random() for _ in range(rng.randint(1, 12))), reverse=True)
        (n,) = share_guesses([Guesses(scores, least=1)], rows=1, tokens=1, cost=cost)
        assert n == max(1, best_length(scores, cost)), scores


def test_each_reply_verifies_fewer_guesses_as_the_batch_grows():
    cost = measured()
    scores = [0.95, 0.9, 0.8, 0.6, 0.45, 0.3, 0.2, 0.1]
    per_reply = []
    for replies in (1, 2, 4, 8, 16):
        takes = share_guesses([Guesses(scores) for _ in range(replies)], rows=replies, tokens=replies, cost=cost)
        assert len(set(takes)) <= 2  # the same guesses get the same share, up to the last one admitted
        per_reply.append(sum(takes) / replies)
    assert per_reply == sorted(per_reply, reverse=True) and per_reply[0] > per_reply[-1], per_reply
    # guesses too unlikely to pay are not verified beside others (alone, one is, to go on measuring)
    assert share_guesses([Guesses([0.05, 0.01]) for _ in range(4)], rows=4, tokens=4, cost=cost) == [0, 0, 0, 0]


def test_the_likeliest_guesses_go_first_whoever_made_them():
    cost = measured(slope=0.3)
    sure, doubtful = Guesses([0.99, 0.98, 0.97, 0.96]), Guesses([0.3, 0.1])
    take_sure, take_doubtful = share_guesses([sure, doubtful], rows=2, tokens=2, cost=cost)
    assert take_sure >= 3 and take_doubtful == 0


def test_a_prefill_chunk_in_the_pass_makes_guesses_cheaper_in_proportion():
    cost = measured(slope=0.2)
    scores = [0.7, 0.6, 0.5, 0.4, 0.3]
    (alone,) = share_guesses([Guesses(scores)], rows=2, tokens=2, cost=cost)
    (beside_chunk,) = share_guesses([Guesses(scores)], rows=130, tokens=2, cost=cost)
    assert beside_chunk >= alone  # a pass already long for a prompt chunk: a guess adds little to its cost


def test_the_cost_model_learns_from_shared_passes_alone():
    cost = measured(base=0.01, slope=0.002, ones=False)
    assert cost.base is None  # no 1-token pass: auto's plain-round baseline is still to be measured
    assert abs(cost.ratio(9) - (1 + 8 * 0.2)) < 1e-6  # but the shape is known: 0.2 of a pass per extra row
