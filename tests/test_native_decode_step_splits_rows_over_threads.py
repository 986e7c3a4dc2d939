"""A decode step (fewer positions than threads) splits each position's rotary and q/k norms (by heads) and its
MLP activation, rotation and quantization (by ranges of whole Hadamard and activation blocks) over the threads.
Every architecture, fp32 and INT4, with and without the down projection's rotation, decoded token by token at 2
and 3 threads gives logits bitwise equal to one thread's, which splits nothing (and which the reference tests
check against PyTorch)."""

from __future__ import annotations

import pytest
import torch
from native_models import logits_in_chunks, rotate_fp, small_model

from parley.models import native_forward
from parley.models.config import SUPPORTED_ARCHITECTURES
from parley.models.native_step import NativeStep
from parley.models.quantize.int4_linear import Int4Linear, decoder_linears

pytestmark = pytest.mark.skipif(native_forward.library() is None,
                                reason=f"native step unavailable: {native_forward.why_unavailable()}")

CASES = [(arch, int4, 0) for arch in SUPPORTED_ARCHITECTURES for int4 in (False, True)]
CASES += [("llama", False, 64), ("llama", True, 64), ("llama", True, 128)]  # 4 and 2 units of the rotation


@pytest.mark.parametrize(("arch", "int4", "block"), CASES)
def test_one_token_passes_at_2_and_3_threads_equal_one_threads(arch: str, int4: bool, block: int) -> None:
    seed = 71 + CASES.index((arch, int4, block))
    model = small_model(False, seed, arch=arch, norms=True)
    if block:
        rotate_fp(model, block, seed)
    if int4:
        for parent, name, lin in decoder_linears(model):
            setattr(parent, name, Int4Linear.from_linear(lin, 64))
    step = NativeStep.for_model(model, head_bits=8 if int4 else 32)
    ids = [(7 * i + seed) % 300 for i in range(36)]
    chunks = [20] + [1] * 14 + [2]  # a prompt, then a decode step per token
    lib = native_forward.library()
    before = lib.parley_threads(-1)
    try:
        runs = {}
        for n in (1, 2, 3):
            lib.parley_threads(n)
            runs[n] = logits_in_chunks(model, ids, chunks, "fp", step)
    finally:
        lib.parley_threads(before)
    for n in (2, 3):
        assert torch.equal(runs[n], runs[1]), f"seed {seed}, {arch} int4={int4} block={block}: {n} threads differ"
