"""The suffix trie holds every substring of up to `depth` tokens with its exact occurrence count, and
its longest-earlier-match length, whether grown token by token, synced to an extended context, or
rolled back to a prefix and grown again (a new turn that re-renders the end of the last one)."""

import random

import pytest

from parley.engine.suffix_trie import _SHIFT, SuffixTrie

DEPTH = 5


def brute_counts(ids: list[int], depth: int) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    for s in range(len(ids)):
        for e in range(s + 1, min(len(ids), s + depth) + 1):
            counts[tuple(ids[s:e])] = counts.get(tuple(ids[s:e]), 0) + 1
    return counts


def brute_match(ids: list[int], depth: int) -> int:
    """The longest suffix (< depth tokens) that also occurs earlier followed by a token."""
    for m in range(min(depth - 1, len(ids)), 0, -1):
        tail = ids[-m:]
        if any(ids[s : s + m] == tail for s in range(len(ids) - m)):
            return m
    return 0


def trie_counts(trie: SuffixTrie) -> dict[tuple[int, ...], int]:
    out: dict[tuple[int, ...], int] = {}
    children: dict[int, list[tuple[int, int]]] = {}
    for key, c in trie._child.items():
        children.setdefault(key >> _SHIFT, []).append((key & ((1 << _SHIFT) - 1), c))

    def walk(node: int, path: tuple[int, ...]) -> None:
        for token, c in children.get(node, []):
            if trie._count[c] > 0:
                out[(*path, token)] = trie._count[c]
                walk(c, (*path, token))

    walk(0, ())
    return out


@pytest.mark.parametrize("seed", range(40))
def test_counts_and_match_after_growth_and_rollback(seed):
    rng = random.Random(seed)
    ids = [rng.randrange(4) for _ in range(rng.randrange(1, 60))]
    trie = SuffixTrie(DEPTH)
    for i in range(0, len(ids), 7):  # grown in steps, as a reply's rounds grow the context
        trie.sync(ids[: i + 7])
        assert trie_counts(trie) == brute_counts(ids[: i + 7], DEPTH), f"seed {seed}: after {i + 7} tokens"
    assert trie.match_length() == brute_match(ids, DEPTH), f"seed {seed}"
    cut = rng.randrange(0, len(ids) + 1)
    edited = ids[:cut] + [rng.randrange(4) for _ in range(rng.randrange(0, 10))]
    trie.sync(edited)
    assert trie.ids == edited
    assert trie_counts(trie) == brute_counts(edited, DEPTH), f"seed {seed}: rolled back to {cut}"
    assert trie.match_length() == brute_match(edited, DEPTH), f"seed {seed}: rolled back to {cut}"
    trie.sync(edited + [3, 1, 2])
    assert trie.match_length() == brute_match(edited + [3, 1, 2], DEPTH), f"seed {seed}: regrown"


@pytest.mark.parametrize("seed", range(30))
def test_each_node_knows_its_continuations_after_growth(seed):
    """What drafting reads besides the counts, against the occurrences themselves: how often a string was
    followed by a token, which token followed it last, a most frequent follower, and its followers listed
    newest first (the sibling chain `tree` walks). A paste mostly makes new nodes, in bulk; a repeat counts up."""
    rng = random.Random(seed)
    vocab = rng.choice([2, 4, 40])
    ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 80))]
    trie = SuffixTrie(DEPTH)
    for i in range(0, len(ids), 5):
        trie.sync(ids[: i + 5])
    for length in range(DEPTH):
        for start in range(len(ids) - length):
            path = ids[start : start + length]
            node = 0
            for t in path:
                node = trie._child[node << _SHIFT | t]
            follows = [(s, ids[s + length]) for s in range(len(ids) - length)
                       if ids[s : s + length] == path and s + length < len(ids)]
            where = f"seed {seed}: after {path}"
            assert trie._out[node] == len(follows), where
            if not follows:
                continue
            tally = {t: sum(1 for _, x in follows if x == t) for _, t in follows}
            assert trie._newest[node] == follows[-1][1], where
            assert tally[trie._best[node]] == max(tally.values()) == trie._best_count[node], where
            listed, c = [], trie._first[node]
            while c >= 0:
                listed.append(trie._token[c])
                c = trie._next[c]
            assert listed == sorted(tally, key=lambda t: -min(s for s, x in follows if x == t)), where


def test_most_frequent_continuation_of_the_longest_match():
    #        "a b x" twice, "a b y" once, then "c a b" (longest match "a b")
    trie = SuffixTrie(8)
    trie.sync([1, 2, 9, 1, 2, 9, 1, 2, 7, 3, 1, 2])
    draft, shares = trie.draft(1)
    assert draft == [9] and shares == [pytest.approx(2 / 3)]
    # a longer match decides over a more frequent shorter one: "3 1 2" was followed by 5 once
    trie.sync([1, 2, 9, 1, 2, 9, 1, 2, 7, 3, 1, 2, 5, 0, 3, 1, 2])
    assert trie.draft(1) == ([5], [1.0])


def test_no_earlier_match_drafts_nothing():
    trie = SuffixTrie(8)
    trie.sync(list(range(50)))
    assert trie.draft(4) == ([], []) and trie.match_length() == 0


def test_depth_is_checked():
    with pytest.raises(ValueError, match="depth=1"):
        SuffixTrie(1)
