"""The CUDA-graph wrapper pads a pass to a bucket without changing what the real rows compute or what
they leave in the KV cache; off CUDA it is a plain call. (Capture itself needs a GPU: gpu_check runs it.)"""

from __future__ import annotations

import torch

from parley.engine.cuda_graphs import GraphedStep, bucket_for, pad_inputs
from tests.tiny import tiny_model

SEED = 7


def test_bucket_is_the_smallest_that_fits() -> None:
    assert [bucket_for(t, (1, 2, 4, 8, 16)) for t in (1, 2, 3, 5, 9, 16, 17)] == [1, 2, 4, 8, 16, 16, None]


def test_pads_go_past_the_last_position_and_stay_inside_the_cache() -> None:
    tokens, positions = torch.tensor([[5, 6, 7]]), torch.tensor([[10, 11, 12]])
    out_t, out_p = torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long)
    pad_inputs(tokens, positions, 8, 15, out_t, out_p)
    assert out_p.tolist() == [[10, 11, 12, 13, 14, 12, 12, 12]]  # slots 15.. do not exist: repeat 12
    assert out_t.tolist() == [[5, 6, 7, 0, 0, 7, 7, 7]]  # ...with its token, so they write what it writes


def test_padded_pass_gives_the_real_rows_and_cache_of_an_unpadded_one() -> None:
    torch.manual_seed(SEED)
    model = tiny_model(seed=SEED, max_len=64)
    prompt = torch.randint(0, 259, (1, 20))
    new = torch.randint(0, 259, (1, 3))
    results = []
    for bucket in (3, 8):
        cache = model.new_cache(64)
        with torch.no_grad():
            model(prompt, torch.arange(20)[None], cache)
            tokens, positions = torch.zeros(1, bucket, dtype=torch.long), torch.zeros(1, bucket, dtype=torch.long)
            pad_inputs(new, torch.arange(20, 23)[None], bucket, 64, tokens, positions)
            logits = model(tokens, positions, cache)[:, :3]
        results.append((logits, cache.k[:, :, :, :23], cache.v[:, :, :, :23]))
    for plain, padded in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(padded, plain, rtol=1e-5, atol=1e-5, msg=f"seed {SEED}")


def test_off_cuda_the_step_runs_eagerly() -> None:
    calls = []
    step = GraphedStep(lambda t, p, window: calls.append(window) or t.float(), "cpu", capacity=64)
    out = step(torch.tensor([[1, 2]]), torch.tensor([[0, 1]]), window=32)
    assert calls == [32] and out.tolist() == [[1.0, 2.0]] and not step.graphs


def test_cached_model_steps_through_the_graph_wrapper_and_survives_a_failed_capture() -> None:
    """CachedModel sends decode/verify passes through its GraphedStep when graphs are on. Forced on here,
    on the CPU, every capture fails: each shape must fall back to eager (reason recorded) with logits
    equal to a plain CachedModel's, and prefill (last_only) never goes through the wrapper."""
    from parley.engine.cached_model import CachedModel

    torch.manual_seed(SEED)
    model = tiny_model(seed=SEED, max_len=64)
    plain, graphed = CachedModel(model, 64), CachedModel(model, 64)
    assert plain.graphed is None  # graphs are a CUDA feature
    graphed.graphed = GraphedStep(graphed._graph_step, "cpu", graphed.max_len)
    graphed.graphed.enabled = True
    prompt = torch.randint(0, 259, (12,)).tolist()
    for cm in (plain, graphed):
        cm.sync(prompt)
    assert not graphed.graphed.fallbacks  # prefill ran eagerly, outside the wrapper
    for tokens in ([5], [6, 7, 8], [9]):
        want, got = plain.forward(tokens), graphed.forward(tokens)
        assert torch.equal(want, got), f"seed {SEED}: {tokens}"
        plain.commit(len(tokens))
        graphed.commit(len(tokens))
    assert len(graphed.graphed.fallbacks) == 2  # buckets 1 and 4 (same window), each tried once
    assert graphed.graphed.replays == 0
