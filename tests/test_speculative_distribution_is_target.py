"""Temperature > 0 with top-p < 1: the first two tokens emitted under speculation follow the target's
exact joint distribution, for prompt lookup and suffix match (q one-hot) and for a draft model whose q
differs from p.

The exact law is computed from the target: P(x1, x2) = p(x1 | ctx) p(x2 | ctx, x1). The bulk of the
draws (20k per drafter) runs the speculative rounds with `verify` on memoised p and q rows, which is
what a reply does minus the repeated forward passes; a smaller set of full `Session.reply` calls then
checks the same law through the real plumbing (drafter, KV rollback, generator, budget cut).

Threshold: Pearson's chi-square over the cells with expected count >= 5 (the rest pooled into one
cell) is chi-square(df) distributed under the null; we fail below a p-value of 1e-3. Seeds are fixed,
so the test is deterministic; the false-alarm rate for a fresh seed would be 1 in 1000. The same
statistic applied to the draft model's own law (what accepting every guess would emit) must fail by
a wide margin, which shows the test has the power to see a wrong verifier at this sample size.
"""

import copy
from collections import Counter

import pytest
import torch
from single_thread import single_thread  # noqa: F401
from spec_helpers import chi_square_p_value, perturbed
from tiny import ByteTokenizer, tiny_engine, tiny_model

from parley.engine.events import TextDelta
from parley.engine.params import GenerationParams
from parley.engine.sampling import probs, sample
from parley.engine.speculative import DraftModel, PromptLookup, SuffixMatch, verify

PARAMS = GenerationParams(temperature=1.2, top_p=0.9, seed=0, max_new_tokens=2, draft_tokens=4)
# An earlier turn repeats the question, so prompt lookup proposes what was answered then.
MESSAGES = [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "\xb6\xf61Z"},
            {"role": "user", "content": "abc"}]
DRAWS = 20_000
REPLIES = 1_500
P_MIN = 1e-3


class Rows:
    """Memoised next-token distributions of a model for any context (full forward, fresh cache)."""

    def __init__(self, model) -> None:
        self.model, self.memo = model, {}

    def __call__(self, ids: tuple[int, ...]) -> torch.Tensor:
        if ids not in self.memo:
            cache = self.model.new_cache(64)
            cache.window = 64
            with torch.inference_mode():
                logits = self.model(torch.tensor([ids]), torch.arange(len(ids))[None], cache, True)[0, -1]
            self.memo[ids] = probs(logits, PARAMS)
        return self.memo[ids]


def exact_joint(p: Rows, ctx: tuple[int, ...]) -> dict[tuple[int, int], float]:
    first = p(ctx)
    law = {}
    for x1 in torch.nonzero(first).flatten().tolist():
        second = p((*ctx, x1))
        for x2 in torch.nonzero(second).flatten().tolist():
            law[(x1, x2)] = float(first[x1]) * float(second[x2])
    return law


def speculate_two(ctx, propose, p: Rows, g: torch.Generator) -> tuple[int, int]:
    """The reply loop's rounds until two tokens are out: draft, verify against the target's rows."""
    out: list[int] = []
    k = PARAMS.draft_tokens
    while len(out) < 2:
        here = (*ctx, *out)
        draft, q = propose(here, k, g)
        rows = torch.stack([p((*here, *draft[:i])) for i in range(len(draft) + 1)])
        new = verify(rows, draft, q, g)
        out += new
        k = 1 if len(new) <= len(draft) else k
    return out[0], out[1]


@pytest.fixture(scope="module")
def setup():
    eng = tiny_engine(seed=11)
    ctx = tuple(eng.tokenizer.encode_chat(MESSAGES))
    p = Rows(eng.model)
    return eng, ctx, p, exact_joint(p, ctx)


def test_prompt_lookup_verify_draws_follow_target(setup):
    eng, ctx, p, law = setup
    lookup = PromptLookup()
    assert lookup.propose(list(ctx), 4).tokens == list(b"\xb6\xf61Z")

    def propose(here, k, g):
        return lookup.propose(list(here), k).tokens, None

    g = torch.Generator().manual_seed(1)
    counts = Counter(speculate_two(ctx, propose, p, g) for _ in range(DRAWS))
    assert chi_square_p_value(counts, law, DRAWS) > P_MIN
    # The first guess was accepted often, and rejected often too: both branches of `verify` ran.
    accepted_first = sum(c for (x1, _), c in counts.items() if x1 == 0xB6) / DRAWS
    assert 0.1 < accepted_first < 0.9, accepted_first


def test_suffix_match_verify_draws_follow_target(setup):
    eng, ctx, p, law = setup
    suffix = SuffixMatch()
    assert suffix.propose(list(ctx), 4).tokens == list(b"\xb6\xf61Z")  # the earlier answer to the same question

    def propose(here, k, g):
        return suffix.propose(list(here), k).tokens, None

    g = torch.Generator().manual_seed(3)
    counts = Counter(speculate_two(ctx, propose, p, g) for _ in range(DRAWS))
    assert chi_square_p_value(counts, law, DRAWS) > P_MIN
    accepted_first = sum(c for (x1, _), c in counts.items() if x1 == 0xB6) / DRAWS
    assert 0.1 < accepted_first < 0.9, accepted_first


def test_draft_model_verify_draws_follow_target(setup):
    eng, ctx, p, law = setup
    q_rows = Rows(perturbed(eng.model))

    def propose(here, k, g):
        draft, rows = [], []
        for _ in range(k):
            q = q_rows((*here, *draft))
            draft.append(sample(q, g))
            rows.append(q)
        return draft, torch.stack(rows)

    g = torch.Generator().manual_seed(2)
    counts = Counter(speculate_two(ctx, propose, p, g) for _ in range(DRAWS))
    assert chi_square_p_value(counts, law, DRAWS) > P_MIN

    # Power: the draft's own law is far from the target's, and the same statistic sees it.
    wrong = Counter()
    for _ in range(DRAWS):
        x1 = sample(q_rows(ctx), g)
        wrong[(x1, sample(q_rows((*ctx, x1)), g))] += 1
    # Draws the target cannot produce fall in the pooled cell, so they count against the draft's law.
    assert chi_square_p_value(wrong, law, DRAWS, outside_allowed=True) < 1e-6


def replies(eng, speculation: str) -> Counter:
    eng.tokenizer.stop_ids = frozenset()  # two tokens always come out
    counts = Counter()
    for i in range(REPLIES):
        params = copy.copy(PARAMS)
        params.speculation, params.seed = speculation, i
        text = "".join(e.text for e in eng.session().reply(MESSAGES, params) if isinstance(e, TextDelta))
        counts[tuple(text.encode("latin-1"))] += 1
    return counts


@pytest.mark.parametrize("mode", ["prompt-lookup", "suffix", "draft"])
def test_full_replies_follow_target(setup, mode):
    _, ctx, _, law = setup
    draft = DraftModel(perturbed(tiny_model(seed=11)), ByteTokenizer(), ByteTokenizer(), min_confidence=0.0)
    eng = tiny_engine(seed=11, draft=draft)
    counts = replies(eng, mode)
    assert sum(counts.values()) == REPLIES and all(len(c) == 2 for c in counts)
    assert chi_square_p_value(counts, law, REPLIES) > P_MIN
