"""A suffix-trie guess chain is, guess after guess, a most frequent continuation of the longest earlier match
of the context's end (the guesses so far included, up to depth - 1 tokens), with that continuation's share of
the match's followers; with `recency`, the newest follower where it is at least half as frequent. The chain
steps from one match to the next by suffix links; this pins it against the occurrences themselves, on
contexts grown in rounds, rolled back and regrown, and with a tail not added to the trie."""

import random

import pytest

from parley.engine.suffix_trie import _SHIFT, SuffixTrie


def followers(ids: list[int], end: list[int]) -> list[int]:
    """The tokens that followed each earlier occurrence of `end` in `ids`, oldest first."""
    m = len(end)
    return [ids[s + m] for s in range(len(ids) - m) if ids[s : s + m] == end]


def allowed(ids: list[int], context: list[int], depth: int, recency: bool) -> tuple[set[int], list[int]]:
    """The tokens a guess may be after `context` (empty: nothing matches) and the longest match's followers."""
    for m in range(min(depth - 1, len(context)), 0, -1):
        after = followers(ids, context[-m:])
        if after:
            tally = {t: after.count(t) for t in after}
            top = max(tally.values())
            if recency and 2 * tally[after[-1]] >= top:
                return {after[-1]}, after
            return {t for t, c in tally.items() if c == top}, after
    return set(), []


@pytest.mark.parametrize("seed", range(60))
def test_draft_chain_against_the_occurrences(seed):
    rng = random.Random(seed)
    depth = rng.choice([2, 3, 5, 8])
    vocab = rng.choice([2, 3, 6])
    ids = [rng.randrange(vocab) for _ in range(rng.randrange(2, 90))]
    trie = SuffixTrie(depth)
    for i in range(0, len(ids), 6):
        trie.sync(ids[: i + 6])
    if seed % 3 == 0:  # rolled back and regrown: the links of nodes whose counts went to 0 and back still hold
        trie.sync(ids[: len(ids) // 2] + [vocab])
        trie.sync(ids)
    tail = [rng.randrange(vocab) for _ in range(seed % 3)]
    for recency in (False, True):
        draft, shares = trie.draft(12, tail=tail, recency=recency)
        context = ids + tail
        for i, (x, share) in enumerate(zip(draft, shares, strict=True)):
            ok, after = allowed(ids, context, depth, recency)
            where = f"seed {seed}, depth {depth}, recency {recency}: guess {i} after {context[-depth:]}"
            assert x in ok, where
            assert share == pytest.approx(after.count(x) / len(after)), where
            context = [*context, x]
        if len(draft) < 12:
            assert allowed(ids, context, depth, recency)[0] == set(), f"seed {seed}: the chain stopped early"


@pytest.mark.parametrize("seed", range(20))
def test_each_suffix_link_drops_the_first_token(seed):
    rng = random.Random(seed)
    depth = rng.choice([3, 5])
    ids = [rng.randrange(3) for _ in range(rng.randrange(1, 70))]
    trie = SuffixTrie(depth)
    for i in range(0, len(ids), 4):
        trie.sync(ids[: i + 4])
    trie.sync(ids[: len(ids) // 3] + [7, 7])
    trie.sync(ids)

    def node_of(path: list[int]) -> int:
        node = 0
        for t in path:
            node = trie._child[node << _SHIFT | t]
        return node

    for start in range(len(ids)):
        for end in range(start + 1, min(len(ids), start + depth) + 1):
            path = ids[start:end]
            assert trie._link[node_of(path)] == node_of(path[1:]), f"seed {seed}: {path}"
