"""After replies mixing accepted and rejected speculative rounds, the target's cache over `cached_ids`
equals a fresh prefill of those tokens, and so does the draft model's own cache."""

import pytest
import torch
from single_thread import single_thread  # noqa: F401
from spec_helpers import perturbed
from tiny import ByteTokenizer, tiny_engine, tiny_model

from parley.engine.events import Stats
from parley.engine.params import GenerationParams
from parley.engine.speculative import DraftModel


def assert_cache_equals_fresh_prefill(model, cache, ids: list[int]) -> None:
    fresh = model.new_cache(cache.max_len)
    fresh.window = cache.max_len
    with torch.inference_mode():
        model(torch.tensor([ids]), torch.arange(len(ids))[None], fresh)
    n = len(ids)
    assert cache.length == n
    torch.testing.assert_close(cache.k[..., :n, :], fresh.k[..., :n, :], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(cache.v[..., :n, :], fresh.v[..., :n, :], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", ["prompt-lookup", "draft"])
def test_caches_equal_fresh_prefill_after_mixed_rounds(mode):
    draft = DraftModel(perturbed(tiny_model(seed=5)), ByteTokenizer(), ByteTokenizer(), min_confidence=0.0)
    eng = tiny_engine(seed=5, draft=draft)
    eng.tokenizer.stop_ids = frozenset()
    convo = [{"role": "user", "content": "one two three, one two three, one two"}]
    proposed = accepted = rejected_rounds = 0
    for temperature in (1.0, 0.0):  # a sampled turn, then a greedy turn reusing its prefix
        params = GenerationParams(temperature=temperature, top_p=0.9, max_new_tokens=40, seed=1,
                                  speculation=mode, draft_tokens=6)
        stats = [e for e in eng.session().reply(convo, params) if isinstance(e, Stats)][-1]
        proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
        rejected_rounds += stats.proposed > stats.accepted
        assert_cache_equals_fresh_prefill(eng.model, eng.target.cache, eng.target.ids)
        if mode == "draft":
            assert_cache_equals_fresh_prefill(draft.model, draft.cached.cache, draft.cached.ids)
        convo = [*convo, {"role": "assistant", "content": "one two"}, {"role": "user", "content": "three one two"}]
    assert accepted > 0 and rejected_rounds > 0 and proposed > accepted
