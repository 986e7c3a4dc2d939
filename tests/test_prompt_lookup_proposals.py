"""PromptLookup proposes what followed the newest earlier match of the longest matching tail n-gram,
and its incremental index agrees with a plain rescan as the context grows, rolls back or changes."""

import random

import pytest

from parley.engine.speculative import PromptLookup


def rescan(context: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The definition, spelled out: longest n first, newest earlier occurrence first."""
    for n in range(min(max_n, len(context) - 1), min_n - 1, -1):
        tail = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start : start + n] == tail:
                return context[start + n : start + n + k]
    return []


def test_longest_match_wins_over_newer_shorter_one():
    #          0  1  2  3  4   5  6  7   8  9  10
    context = [1, 2, 3, 4, 50, 9, 3, 60, 1, 2, 3]
    # the 3-gram [1, 2, 3] at 0 is followed by 4; the newer 1-gram [3] at 6 by 60
    assert PromptLookup(min_n=1, max_n=3).propose(context, 2).tokens == [4, 50]
    assert PromptLookup(min_n=1, max_n=1).propose(context, 2).tokens == [60, 1]


def test_newest_occurrence_and_k_limit():
    context = [7, 8, 1, 7, 8, 2, 3, 4, 7, 8]
    assert PromptLookup(min_n=2, max_n=2).propose(context, 3).tokens == [2, 3, 4]
    assert PromptLookup(min_n=2, max_n=2).propose(context, 1).tokens == [2]


def test_no_match_proposes_nothing():
    assert PromptLookup().propose(list(range(100)), 8).tokens == []
    assert PromptLookup(min_n=3).propose([5, 6, 1, 5, 6], 4).tokens == []  # only a 2-gram repeats
    assert PromptLookup().propose([1], 4).tokens == []
    assert PromptLookup().propose([1, 2, 1, 2], 0).tokens == []


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="min_n=3, max_n=2"):
        PromptLookup(min_n=3, max_n=2)


def test_incremental_index_matches_rescan():
    rng = random.Random(0)
    lookup = PromptLookup(min_n=1, max_n=4)
    context = [rng.randrange(6) for _ in range(20)]
    for step in range(400):
        k = rng.randrange(1, 9)
        assert lookup.propose(context, k).tokens == rescan(context, k, 1, 4), step
        r = rng.random()
        if r < 0.8:  # a round: the accepted tokens and the next pending one
            context = context + [rng.randrange(6) for _ in range(rng.randrange(1, 4))]
        elif r < 0.9:  # a new turn that shares only a prefix with the last
            context = context[: rng.randrange(1, len(context))] + [rng.randrange(6)]
        else:
            context = [rng.randrange(6) for _ in range(rng.randrange(2, 30))]


class CountingTable(dict):
    """An n-gram table that counts the positions written into it: the work of indexing."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def __setitem__(self, key, value) -> None:
        self.writes += 1
        super().__setitem__(key, value)


def test_rounds_on_a_long_context_cost_far_less_than_a_rescan():
    """A 4k-token context with no repeats (the costly case for a rescan): after the first round indexes
    it, each of 50 rounds of growth indexes only the new positions -- counted, not timed."""
    rng = random.Random(1)
    context = rng.sample(range(100_000), 4000)
    lookup = PromptLookup(min_n=2, max_n=4)
    lookup._index = {n: CountingTable() for n in lookup._index}
    written = lambda: sum(t.writes for t in lookup._index.values())  # noqa: E731
    lookup.propose(context, 8)  # builds the index once, as the first round of a reply does
    first = written()
    assert first == sum(4000 - n for n in (2, 3, 4))  # every position with a follower, per n
    for i in range(50):
        context = context + [100_000 + i]
        assert lookup.propose(context, 8).tokens == rescan(context, 8, 2, 4)
    assert written() - first == 50 * 3  # one new position per n per round; a rescan would redo ~12k each
