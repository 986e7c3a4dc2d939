"""One native pass over several sequences gives each sequence, bitwise, the logits and the cache it gets alone.

The multi-sequence pass is what continuous batching runs: rows of different sequences (a decode token, a
verification of guesses, a prefill chunk, a tree of guesses) share the products, while each row writes and
attends its own sequence's cache. Checked for INT4, fp32 and bf16 weights (every weight kind the step reads;
test_native_portable_loops runs this file in the AVX2 flavour too) and every KV cache type, against each
sequence's own single-sequence pass from an identical cache: logits equal bitwise, and every cache holds the
same bytes afterwards. Depths straddle the 256-key attention block, so sequences of different block counts
share the pass.
"""

from __future__ import annotations

import random

import pytest
import torch
from native_models import small_model

from parley.models import native_forward
from parley.models.native_step import NativeStep
from parley.models.transformer import KV_CACHE_TYPES

pytestmark = pytest.mark.skipif(native_forward.library() is None,
                                reason=f"native step unavailable: {native_forward.why_unavailable()}")


def prefilled(model, step, kind: str, ids: list[int]):
    cache = model.new_cache(600, kind=kind)
    if ids:
        with torch.inference_mode():
            step(torch.tensor([ids]), torch.arange(len(ids))[None], cache, last_only=True)
    return cache


def same_cache(a, b, length: int) -> bool:
    names = [n for n, _ in a.named_buffers()]
    return all(torch.equal(getattr(a, n)[:, :, :length], getattr(b, n)[:, :, :length]) for n in names)


WEIGHTS = ("int4", "fp32", "bf16")


@pytest.mark.parametrize("kind", KV_CACHE_TYPES)
@pytest.mark.parametrize("weights", WEIGHTS)
def test_each_sequence_of_a_shared_pass_gets_its_solo_logits_and_cache(kind: str, weights: str) -> None:
    seed = 5 + WEIGHTS.index(weights) + 3 * KV_CACHE_TYPES.index(kind)
    rng = random.Random(seed)
    model = small_model(weights == "int4", seed)
    if weights == "bf16":  # a bf16 checkpoint as --quant none holds it: W_BF16 products, head and embedding
        model = model.to(torch.bfloat16)
    step = NativeStep.for_model(model, head_bits=8 if weights == "int4" else 32)
    if weights == "bf16":
        assert step.md.embed_dtype == 1
    depths = [270, 3, 0, 40, 250]  # context each sequence holds before the shared pass
    contexts = [[rng.randrange(300) for _ in range(d)] for d in depths]
    tree_parents = [-1, 0, 0, 1, 2, 2, 4]
    tree_depth = [0, 1, 1, 2, 2, 2, 3]
    # (new tokens, parents or None, first row whose logits are wanted)
    shares = [([rng.randrange(300)], None, 0),  # a decode token
              ([rng.randrange(300) for _ in range(6)], None, 0),  # verifying five guesses
              ([rng.randrange(300) for _ in range(33)], None, 33),  # a prefill chunk: no logits
              ([rng.randrange(300) for _ in range(7)], tree_parents, 0),  # a tree of guesses
              ([rng.randrange(300) for _ in range(9)], None, 8)]  # a last prefill chunk: its last row
    solo = [prefilled(model, step, kind, c) for c in contexts]
    shared = [prefilled(model, step, kind, c) for c in contexts]

    parts, expected = [], []
    with torch.inference_mode():
        for cache, context, (tokens, parents, wanted) in zip(solo, contexts, shares, strict=True):
            base = len(context)
            if parents is None:
                positions = list(range(base, base + len(tokens)))
                logits = step(torch.tensor([tokens]), torch.tensor([positions]), cache)[0]
            else:
                positions = [base + d for d in tree_depth]
                logits = step.tree(tokens, parents, base, cache)
            expected.append(logits[wanted:])
        for cache, context, (tokens, parents, wanted) in zip(shared, contexts, shares, strict=True):
            base = len(context)
            positions = [base + d for d in tree_depth] if parents else list(range(base, base + len(tokens)))
            parts.append((cache, tokens, positions, parents, wanted))
        got = step.batch(parts)

    for i, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have.shape == want.shape, f"seed={seed}: sequence {i} got {tuple(have.shape)} rows"
        assert torch.equal(have, want), f"seed={seed}: sequence {i}'s logits differ from its pass alone"
    for i, (a, b) in enumerate(zip(solo, shared, strict=True)):
        assert same_cache(a, b, depths[i] + len(shares[i][0])), f"seed={seed}: sequence {i}'s cache differs"


def test_a_batch_of_one_is_the_single_sequence_pass() -> None:
    model = small_model(True, 3)
    step = NativeStep.for_model(model, head_bits=8)
    ids = list(range(40, 90))
    a, b = model.new_cache(600, kind="int8"), model.new_cache(600, kind="int8")
    with torch.inference_mode():
        alone = step(torch.tensor([ids]), torch.arange(50)[None], a)[0]
        (batched,) = step.batch([(b, ids, list(range(50)), None, 0)])
    assert torch.equal(alone, batched)


def test_malformed_parts_are_refused() -> None:
    model = small_model(True, 4)
    step = NativeStep.for_model(model, head_bits=8)
    cache = model.new_cache(600, kind="int8")
    with pytest.raises(ValueError, match="positions exceed"):
        step.batch([(cache, [1, 2], [599, 600], None, 0)])
    with pytest.raises(ValueError, match="not a tree"):
        step.batch([(cache, [1, 2, 3], [0, 1, 2], [-1, 0, 5], 0)])
    with pytest.raises(ValueError, match="out of range"):
        step.batch([(cache, [1, 300], [0, 1], None, 0)])
