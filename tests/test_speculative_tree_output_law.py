"""Whole replies verified as trees (several suffix-trie candidates per pass, on the native step) follow the
target's own law, without and with a repeat penalty: the chi-square test of test_speculative_output_law,
with the tree drafter (`--speculation suffix-tree`).

The conversation holds three earlier answers, among the target's likeliest, that part at their first and fourth
tokens ("¨tÓDÓD", "¹ÓDÓDÓ", "¨tÓcDÓ"), so the trie's counts leave those tokens in doubt and the drafter
proposes the candidates side by side; replies in which the pass
kept a branch other than the first (the target chose the second candidate, whose K/V were then moved into
place) must occur, or the tree rule was never exercised. The law is computed from the same native step
(one-token passes on a fresh cache), so the comparison is exact in distribution: a tree rule that accepted a
child with its drafter's share instead of sampling from the target, or penalised a node with a sibling's
path, shifts it.
"""

import itertools
from collections import Counter
from dataclasses import replace

import pytest
import torch
from single_thread import single_thread  # noqa: F401
from test_speculative_output_law import (
    P_MIN,
    PENALISED,
    PLAIN,
    REPLIES,
    VisibleTokens,
    chi_square_p_value,
    likely_replies,
    probability,
    target_model,
)

import parley.engine.scheduler as scheduler_module
import parley.engine.speculation_pay as speculation_pay
from parley.engine.engine import Engine
from parley.engine.events import Done, Stats, TextDelta
from parley.engine.sampling import probs
from parley.engine.speculation_pay import AdaptiveDraftLength, PassCost
from parley.engine.speculative import SuffixMatch
from parley.models import native_forward
from parley.models.native_step import NativeStep

pytestmark = pytest.mark.skipif(native_forward.library() is None,
                                reason=f"native step unavailable: {native_forward.why_unavailable()}")

MESSAGES = [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "¹ÓDÓDÓ"},
            {"role": "user", "content": "abc"}, {"role": "assistant", "content": "¨tÓDÓD"},
            {"role": "user", "content": "abc"}, {"role": "assistant", "content": "¹ÓDÓc"},
            {"role": "user", "content": "." * 70 + "abc"}]


class NativeRows:
    """The target's next-token distribution after any context, from the native step on a fresh cache."""

    def __init__(self, model, step, params) -> None:
        self.model, self.step, self.params, self.memo = model, step, params, {}

    def __call__(self, ids: tuple[int, ...]) -> torch.Tensor:
        if ids not in self.memo:
            cache = self.model.new_cache(256, kind="fp")
            with torch.inference_mode():
                logits = self.step(torch.tensor([ids]), torch.arange(len(ids))[None], cache, True)[0]
            self.memo[ids] = probs(logits, self.params, history=list(ids))[0].double()
        return self.memo[ids]


@pytest.fixture(scope="module")
def engine():
    model = target_model()
    eng = Engine(model, VisibleTokens(), name="tiny", kv_cache="fp", native=NativeStep.for_model(model, head_bits=32))
    eng.suffix_tree = SuffixMatch(width=3, min_score=0.1)
    return eng


@pytest.mark.parametrize("params", [PLAIN, PENALISED], ids=["plain", "repeat_penalty"])
def test_tree_verified_replies_follow_the_target_law(engine, params, monkeypatch):
    # Every round "costs" the same whatever its length, so the drafter's trees are verified whole (on the
    # tiny model the measured cost of a longer pass would cut most of them to a chain).
    monkeypatch.setattr(scheduler_module, "round_clock", itertools.count().__next__)
    # and every reply starts at the longest draft, so the first round's tree is 8 nodes deep enough to repeat a
    # token it guessed (the penalty of its rows then depends on the path emitted before them)
    monkeypatch.setattr(speculation_pay, "AdaptiveDraftLength", lambda k_max: AdaptiveDraftLength(k_max, k=k_max))
    engine.pass_cost = PassCost()
    counts, proposed, accepted, branches = Counter(), 0, 0, 0
    commit_path = engine.target.commit_path

    def spy(nodes):  # a kept path that leaves the chain: a candidate other than the first one landed
        nonlocal branches
        branches += any(m != d for d, m in enumerate(nodes))
        commit_path(nodes)

    engine.target.commit_path = spy
    try:
        for seed in range(REPLIES):
            round_params = replace(params, speculation="suffix-tree", seed=seed, draft_tokens=8)
            events = list(engine.session().reply(MESSAGES, round_params))
            done, stats = events[-1], [e for e in events if isinstance(e, Stats)][-1]
            assert isinstance(done, Done) and done.reason in ("eos", "length"), f"seed {seed}: {done}"
            text = "".join(e.text for e in events if isinstance(e, TextDelta))
            counts[(tuple(map(ord, text)), done.reason)] += 1
            proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
    finally:
        del engine.target.commit_path
    assert stats.drafter == "suffix tree", stats.drafter
    assert 0 < accepted < proposed, (accepted, proposed)
    assert branches >= 20, f"only {branches} replies kept a second candidate: the tree rule was hardly exercised"

    ctx = tuple(engine.tokenizer.encode_chat(MESSAGES))
    rows = NativeRows(engine.model, engine.native, params)
    impossible = [("".join(map(chr, r)), why) for r, why in counts if probability(rows, ctx, r, why) == 0]
    assert not impossible, f"replies plain decoding cannot produce: {impossible[:5]}"
    law = likely_replies(rows, ctx, floor=5 / REPLIES)
    assert len(law) >= 10 and sum(law.values()) > 0.4, (len(law), sum(law.values()))
    p_value = chi_square_p_value(counts, law, REPLIES)
    assert p_value > P_MIN, f"{params}: chi-square p-value {p_value:.2e}; most frequent {counts.most_common(5)}"
