"""The native step computes `Transformer.forward` for every architecture Parley loads, fp32 and INT4.

Every norm weight is distinct and far from 1 (input, post-attention, final, and qwen3's per-head q and k
norms), so a step that reads one norm's weights where another's belong (e.g. qwen3's keys normalised with
`q_norm`: logits off by ~40%) gives other logits. fp32: within 1e-4 of PyTorch (relative max error); INT4:
the native step also quantizes activations to 8 bits, so within 5% (relative norm), while a swapped norm moves
the logits by far more than that.
"""

from __future__ import annotations

import pytest
import torch
from native_models import logits_in_chunks, small_model

from parley.models import native_forward
from parley.models.config import SUPPORTED_ARCHITECTURES
from parley.models.native_step import NativeStep, NativeUnavailable

pytestmark = pytest.mark.skipif(native_forward.library() is None,
                                reason=f"native step unavailable: {native_forward.why_unavailable()}")


@pytest.mark.parametrize("int4", [False, True], ids=["fp32", "int4"])
@pytest.mark.parametrize("arch", SUPPORTED_ARCHITECTURES)
def test_native_step_equals_the_pytorch_forward(arch: str, int4: bool) -> None:
    seed = 31 + SUPPORTED_ARCHITECTURES.index(arch)
    model = small_model(int4, seed, arch=arch, norms=True)
    if arch == "qwen3":
        q, k = model.layers[0].self_attn.q_norm.weight, model.layers[0].self_attn.k_norm.weight
        assert not torch.equal(q, k)
    ids = [(7 * i + seed) % 300 for i in range(70)]
    ref = logits_in_chunks(model, ids, [70], "fp")
    try:
        step = NativeStep.for_model(model, head_bits=32)
    except NativeUnavailable as why:
        raise AssertionError(f"{arch}: the native step declined the model: {why}") from None
    got = logits_in_chunks(model, ids, [40, 30], "fp", step)
    if int4:
        rel = ((got - ref).norm() / ref.norm()).item()
        assert rel < 0.05, f"seed={seed} {arch} INT4: relative error {rel}"
    else:
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        assert err < 1e-4, f"seed={seed} {arch} fp32: relative max error {err}"
