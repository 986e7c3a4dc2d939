"""CachedModel reads the cache through a window rounded up to a 256-slot bucket; a pass whose last
position is 255, 256 or 257 (and a verification pass straddling the edge) must see every earlier slot
and its own: its logits equal a full-window pass over a fresh cache (issue 10, mutant 8: the window
one slot short at the bucket edge, so position 256 does not attend to itself)."""

import pytest
import torch
from single_thread import single_thread  # noqa: F401
from tiny import tiny_model

from parley.engine.cached_model import WINDOW_BUCKET, CachedModel

IDS = torch.randint(0, 256, (600,), generator=torch.Generator().manual_seed(0)).tolist()


def full_window_logits(model, ids: list[int]) -> torch.Tensor:
    cache = model.new_cache(512)
    with torch.inference_mode():
        return model(torch.tensor([ids]), torch.arange(len(ids))[None], cache, False, 512)[0]


@pytest.mark.parametrize("end", [WINDOW_BUCKET - 1, WINDOW_BUCKET, WINDOW_BUCKET + 1, WINDOW_BUCKET + 2, 512])
@pytest.mark.parametrize("pass_len", [1, 3])
def test_pass_ending_at_the_bucket_edge_sees_every_slot(end, pass_len):
    model = tiny_model(seed=1)
    want = full_window_logits(model, IDS[:end])[-pass_len:]
    cached = CachedModel(model, 512)
    cached.sync(IDS[: end - pass_len])
    got = cached.forward(IDS[end - pass_len : end])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_commit_rollback_sync():
    model = tiny_model(seed=1)
    cached = CachedModel(model, 512)
    assert cached.sync(IDS[:300]) == 0 and cached.ids == IDS[:300]
    cached.forward(IDS[300:305])
    cached.commit(2)
    assert cached.ids == IDS[:302] and cached.cache.length == 302
    with pytest.raises(ValueError, match="not a prefix"):
        cached.commit(1)  # nothing left to claim: the forward's tokens were consumed
    cached.forward([1, 2, 3])
    with pytest.raises(ValueError, match="not a prefix"):
        cached.commit([1, 3])
    cached.commit([1, 2])
    assert cached.ids == [*IDS[:302], 1, 2]
    assert cached.sync(IDS[:310]) == 302  # keeps the common prefix, feeds the rest
    cached.rollback(100)
    assert cached.ids == IDS[:100] and cached.cache.length == 100
    torch.testing.assert_close(cached.forward(IDS[100:101]), full_window_logits(model, IDS[:101])[-1:],
                               atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="exceed the context window of 512"):
        cached.forward([0] * 413)
