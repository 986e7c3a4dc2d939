"""The online rotation before down_proj (models/quantize/hadamard.py) changes the basis, not the function:
`block_hadamard` is the block-diagonal Sylvester matrix, the rotated weight times the rotated input is the
plain product, and an fp32 model with the rotation installed gives the logits it gave without it -- on the
PyTorch forward and on the native step, which must apply the same rotation (a step that skipped it, or
rotated with the wrong block, would be far off)."""

from __future__ import annotations

import pytest
import torch
from native_models import logits_in_chunks, rotate_fp, small_model

from parley.models import native_forward
from parley.models.native_step import NativeStep
from parley.models.quantize import hadamard
from parley.models.quantize.awq import gram
from parley.models.quantize.int4_linear import Int4Linear
from parley.models.quantize.rotate import hadamard as sylvester
from parley.models.transformer import block_hadamard


@pytest.mark.parametrize("block", [2, 16, 64])
def test_block_hadamard_is_the_block_diagonal_sylvester_matrix(block):
    """Both ways of computing it: the butterflies (CPU) and one product by the matrix (the GPU path)."""
    x = torch.randn(3, 5, 128, generator=torch.Generator().manual_seed(block), dtype=torch.float64)
    h = sylvester(block)
    assert torch.equal(hadamard.sylvester(block).double(), h)
    want = (x.reshape(3, 5, -1, block) @ h).reshape(x.shape)  # H symmetric: row vectors times H
    for matmul in (False, True):
        got = block_hadamard(x, h, matmul=matmul)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12, msg=f"seed {block}, matmul={matmul}")


@pytest.mark.skipif(native_forward.library() is None,
                    reason=f"native step unavailable: {native_forward.why_unavailable()}")
@pytest.mark.parametrize("block", [2, 8, 16, 32, 256])
def test_the_native_rotation_is_bitwise_pytorchs(block):
    """Same additions in the same order (the vector loops for blocks of 16 and more, the portable ones below):
    the native step's down_proj reads the very input the PyTorch forward does."""
    import ctypes

    gen = torch.Generator().manual_seed(block)
    x = torch.randn(4, 1536, generator=gen) * torch.exp(3 * torch.randn(4, 1536, generator=gen))
    d = hadamard.rotation_diag(1536, block, seed=block)
    want = block_hadamard(x * d, hadamard.sylvester(block))
    got = x.clone()
    for row in got:
        native_forward.library().parley_hadamard_row(ctypes.c_void_p(row.data_ptr()), 1536,
                                                     ctypes.c_void_p(d.data_ptr()), block)
    assert torch.equal(got, want), f"seed {block}: max difference {(got - want).abs().max().item()}"


def test_rotated_weight_times_rotated_input_is_the_plain_product():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(40, 256, generator=gen, dtype=torch.float64)
    x = torch.randn(7, 256, generator=gen, dtype=torch.float64)
    d = hadamard.rotation_diag(256, 64, seed=3)
    assert set(d.abs().tolist()) == {1 / 8}
    got = hadamard.rotate_input(x, d.double(), 64) @ hadamard.rotate_weight(w, d, 64).t()
    torch.testing.assert_close(got, x @ w.t(), rtol=1e-10, atol=1e-10, msg="seed 3")
    rotated = hadamard.rotate_input(x, d.double(), 64)
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1), msg="seed 3")  # orthogonal
    assert not torch.allclose(rotated, x)


@pytest.mark.parametrize("block", [16, 256])
def test_an_fp32_model_with_the_rotation_keeps_its_logits_on_every_path(block):
    seed = 11
    model = small_model(False, seed, norms=True)
    ids = [(5 * i + seed) % 300 for i in range(50)]
    before = logits_in_chunks(model, ids, [50], "fp")
    rotate_fp(model, block, seed)
    assert model.layers[1].mlp.down_hadamard.shape == (block, block)
    after = logits_in_chunks(model, ids, [50], "fp")
    err = ((after - before).abs().max() / before.abs().max()).item()
    assert err < 1e-5, f"seed {seed}: the rotation changed the PyTorch logits by {err}"
    if native_forward.library() is None:
        pytest.skip(f"native step unavailable: {native_forward.why_unavailable()}")
    got = logits_in_chunks(model, ids, [30, 1, 19], "fp", NativeStep.for_model(model, head_bits=32))
    err = ((got - before).abs().max() / before.abs().max()).item()
    assert err < 1e-4, f"seed {seed}: the native step's logits are off by {err} (relative max) with the rotation"


def test_the_native_step_rotates_an_int4_down_proj_as_pytorch_does():
    """INT4 down_proj quantized on rotated inputs: the native step (int8 activations) within 5% of PyTorch, and
    the same model read without its rotation is far off (so the 5% can see a skipped rotation)."""
    seed = 12
    model = small_model(False, seed, norms=True)
    rotate_fp(model, 256, seed)
    for layer in model.layers:
        layer.mlp.down_proj = Int4Linear.from_linear(layer.mlp.down_proj, 64)
    ids = [(3 * i + seed) % 300 for i in range(40)]
    ref = logits_in_chunks(model, ids, [40], "fp")
    if native_forward.library() is None:
        pytest.skip(f"native step unavailable: {native_forward.why_unavailable()}")
    got = logits_in_chunks(model, ids, [25, 15], "fp", NativeStep.for_model(model, head_bits=32))
    rel = ((got - ref).norm() / ref.norm()).item()
    assert rel < 0.05, f"seed {seed}: relative error {rel}"
    for layer in model.layers:
        layer.mlp.down_diag = None
    unrotated = logits_in_chunks(model, ids, [40], "fp")
    assert ((unrotated - ref).norm() / ref.norm()).item() > 0.2, f"seed {seed}"


def test_the_rotated_gram_matrix_is_the_gram_matrix_of_the_rotated_inputs():
    """awq.quantize_rotated calibrates the rotated down_proj on R^T G R of the plain inputs' Gram matrix G
    instead of a second pass over every token: the same matrix."""
    seed = 21
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(300, 512, generator=g) * torch.rand(512, generator=g) * 3
    diag = hadamard.rotation_diag(512, 256, seed)
    direct = gram(hadamard.rotate_input(x, diag, 256))
    torch.testing.assert_close(hadamard.rotate_gram(gram(x), diag, 256), direct, atol=1e-4, rtol=1e-5,
                               msg=f"seed {seed}")
