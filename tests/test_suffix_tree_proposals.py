"""The suffix tree drafter proposes, where the trie's counts leave the next token in doubt, the candidates with
the highest running probability side by side (best first, each parent before its children, so any prefix the
cost model keeps is a tree); with one candidate per node it is the suffix-match chain. Where the target has no
tree passes (the PyTorch path), `--speculation suffix-tree` drafts chains."""

from tiny import tiny_engine

from parley.engine.speculative import SuffixMatch, depth_first

# "5 6" was followed by 7 twice and by 8 once; "5 6 7" by 9 once and 3 once; "5 6 8" by 0 once
CONTEXT = [1, 5, 6, 7, 9, 2, 5, 6, 7, 3, 4, 5, 6, 8, 0, 5, 6]


def test_tree_holds_the_likeliest_candidates_best_first():
    drafter = SuffixMatch(width=3, min_score=0.2)
    draft, q = (p := drafter.propose(CONTEXT, 4)).tokens, p.q
    assert q is None and drafter.name == "suffix tree"
    # 7 (2/3); then 8 (1/3, pushed first) and 3 (2/3 * 1/2, the newer continuation) tie with 9 (1/3)
    assert draft == [7, 8, 3, 9] and p.parents == [-1, -1, 0, 0]
    assert p.scores == [2 / 3, 1 / 3, 1 / 3, 1 / 3]
    # width 1 is the chain suffix match proposes
    chain = SuffixMatch(min_score=0.2)
    width_one = SuffixMatch(width=1, min_score=0.2)
    assert chain.propose(CONTEXT, 4).tokens == width_one.propose(CONTEXT, 4).tokens == [7, 3, 4, 5]


def test_min_score_bounds_the_tree():
    drafter = SuffixMatch(width=3, min_score=0.4)
    assert (p := drafter.propose(CONTEXT, 8)).tokens == [7] and p.parents == [-1]


def test_depth_first_puts_the_first_chain_first():
    # guesses chosen best first: 0 <- root, 1 <- root, 2 <- 0, 3 <- 0, 4 <- 2, 5 <- 1
    assert depth_first([-1, -1, 0, 0, 2, 1]) == [0, 2, 4, 3, 1, 5]


def test_pytorch_path_drafts_chains():
    eng = tiny_engine()
    assert eng.native is None and eng.drafter("suffix-tree") is eng.suffix_match
