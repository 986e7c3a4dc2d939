"""SuffixMatch proposes the most frequent continuation of the longest earlier match, for as long as
the evidence carries it: at most `per_match` tokens per token of match, and only while the chain's
running probability stays above `min_score`. It follows the context as it grows without rebuilding."""

from parley.engine.speculative import SuffixMatch

DOC = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]


def test_long_match_copies_far_short_match_guesses_little():
    context = [*DOC, 1, *DOC[:6]]  # the document, then its first 6 tokens again: a 6-token match
    assert SuffixMatch(per_match=2.0).propose(context, 16).tokens == DOC[6:] + [1] + DOC[:7]  # 12 tokens
    assert SuffixMatch(per_match=0.5).propose(context, 16).tokens == DOC[6:9]
    # a 1-token match is worth per_match tokens
    assert SuffixMatch(per_match=2.0).propose([*DOC, 2, 3, 4, 12], 16).tokens == [13, 14]
    assert SuffixMatch().propose([*DOC, 1, 2, 3], 16).tokens == []  # nothing matches
    assert SuffixMatch().propose(DOC, 0).tokens == []


def test_chain_stops_where_its_probability_falls():
    # the longest match is "5 6": 7 followed it twice, 8 once (a 2/3 share); then "5 6 7" was followed
    # by 9 once and 3 once (1/2: the newer, 3, is proposed), so the chain's probability is 2/3, then 1/3
    context = [1, 5, 6, 7, 9, 2, 5, 6, 7, 3, 4, 5, 6, 8, 0, 5, 6]
    drafter = SuffixMatch(min_score=0.3)
    p = drafter.propose(context, 2)
    assert p.tokens == [7, 3] and p.scores == [2 / 3, 1 / 3]
    assert SuffixMatch(min_score=0.5).propose(context, 2).tokens == [7]


def test_follows_a_growing_context_without_rebuilding():
    drafter = SuffixMatch()
    context = [*DOC, 1, *DOC[:3]]
    drafter.propose(context, 4)
    trie = drafter.trie
    nodes = len(trie._count)
    context += [13, 14]  # the reply went on, copying the document
    assert drafter.propose(context, 4).tokens == [15, 16, 17, 18]
    assert drafter.trie is trie and len(trie._count) > nodes and trie.ids == context
    edited = context[:-2] + [99]  # a new turn re-renders the end: rolled back, not rebuilt
    assert drafter.propose(edited, 4).tokens == [] and drafter.trie is trie and trie.ids == edited
