"""DraftModel: q rows are `sampling.probs` of the draft's logits, drafting stops where the draft's own
top probability falls below the threshold, its cache follows any context by longest common prefix,
and a self-draft shares the target's weights."""

from dataclasses import replace

import torch
from single_thread import single_thread  # noqa: F401
from tiny import ByteTokenizer, tiny_model

from parley.engine.params import GenerationParams
from parley.engine.sampling import probs
from parley.engine.speculative import DraftModel
from parley.models.transformer import Transformer

GREEDY = GenerationParams(temperature=0)


def full_logits(model, ids: list[int]) -> torch.Tensor:
    cache = model.new_cache(128)
    cache.window = 128
    with torch.inference_mode():
        return model(torch.tensor([ids]), torch.arange(len(ids))[None], cache)[0]


def test_greedy_drafts_and_q_rows_match_the_model():
    model = tiny_model(seed=2)
    draft = DraftModel(model, ByteTokenizer(), ByteTokenizer(), min_confidence=0.0)
    ctx = list(b"hello world")
    guess, q = (p := draft.propose(ctx, 5, GREEDY)).tokens, p.q
    logits = full_logits(model, ctx + guess)
    want = logits[len(ctx) - 1 : -1].argmax(-1).tolist()
    assert guess == want
    torch.testing.assert_close(q, probs(logits[len(ctx) - 1 : -1], GREEDY))
    sampled = GenerationParams(temperature=0.8, top_p=0.9)
    guess, q = (p := draft.propose(ctx, 3, sampled, torch.Generator().manual_seed(0))).tokens, p.q
    torch.testing.assert_close(q, probs(full_logits(model, ctx + guess)[len(ctx) - 1 : -1], sampled),
                               atol=1e-5, rtol=1e-4)


def test_drafting_stops_where_confidence_drops():
    model = tiny_model(seed=2)
    ctx = list(b"hello world")
    guess = DraftModel(model, ByteTokenizer(), ByteTokenizer(), min_confidence=0.0).propose(ctx, 8, GREEDY).tokens
    top = torch.softmax(full_logits(model, ctx + guess)[len(ctx) - 1 : -1], -1).amax(-1)
    threshold = float(top[1:].min()) + 1e-6  # the least confident later position is where it must stop
    stop = int((top < threshold).nonzero()[0])
    p = DraftModel(model, ByteTokenizer(), ByteTokenizer(), min_confidence=threshold).propose(ctx, 8, GREEDY)
    short, q = p.tokens, p.q
    assert short == guess[:stop] and (q is None if stop == 0 else q.shape[0] == stop)
    none = DraftModel(model, ByteTokenizer(), ByteTokenizer(), min_confidence=1.01)
    assert none.propose(ctx, 8, GREEDY).tokens == []


def test_cache_follows_context_by_common_prefix():
    model = tiny_model(seed=2)
    draft = DraftModel(model, ByteTokenizer(), ByteTokenizer(), min_confidence=0.0)
    ctx = list(b"the quick brown fox")
    guess = draft.propose(ctx, 4, GREEDY).tokens
    assert draft.cached.ids == ctx + guess[:-1]  # the last guess is never fed
    edited = list(b"the quick red fox")  # an earlier turn edited: only "the quick " is kept
    again = draft.propose(edited, 4, GREEDY).tokens
    fresh = DraftModel(model, ByteTokenizer(), ByteTokenizer(), min_confidence=0.0).propose(edited, 4, GREEDY).tokens
    assert again == fresh and draft.cached.ids == edited + again[:-1]


def test_self_draft_shares_the_targets_weights():
    target = tiny_model(seed=2, layers=4)
    draft = DraftModel.self_draft(target, 2, ByteTokenizer(), min_confidence=0.0)
    assert draft.model.config.n_layers == 2 and len(draft.model.layers) == 2
    shared = {p.data_ptr() for p in target.parameters()}
    assert all(p.data_ptr() in shared for p in draft.model.parameters())
    assert draft.model.lm_head.weight is target.lm_head.weight
    ctx = list(b"abc")
    guess = draft.propose(ctx, 3, GREEDY).tokens
    # the same as a 2-layer model holding copies of the target's first two layers, norm and head
    small = Transformer(replace(target.config, n_layers=2))
    small.load_state_dict(target.state_dict(), strict=False)
    want = full_logits(small.eval(), ctx + guess)[len(ctx) - 1 : -1].argmax(-1).tolist()
    assert guess == want


def test_q_rows_fit_the_targets_logit_width():
    """Embedding tables padded to different sizes: q is cut or padded to the target's width, and no
    guess falls outside it."""
    wide = tiny_model(seed=2, vocab=300)  # 41 padding rows beyond the 259-token vocabulary
    with torch.no_grad():
        wide.lm_head.weight[259:] = 5.0  # padding rows the draft would otherwise love
    draft = DraftModel(wide, ByteTokenizer(), ByteTokenizer(), min_confidence=0.0, vocab_size=259)
    p = draft.propose(list(b"abc"), 4, GenerationParams(temperature=1.0, top_p=1.0), torch.Generator().manual_seed(0))
    guess, q = p.tokens, p.q
    assert q.shape == (4, 259) and all(g < 259 for g in guess)
    narrow = DraftModel(tiny_model(seed=2), ByteTokenizer(), ByteTokenizer(), min_confidence=0.0, vocab_size=320)
    q = narrow.propose(list(b"abc"), 2, GREEDY).q
    assert q.shape == (2, 320) and float(q[:, 259:].sum()) == 0.0
