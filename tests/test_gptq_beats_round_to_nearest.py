"""GPTQ rounding on the fixed AWQ grid: the layer's output error on correlated calibration inputs is well
below round-to-nearest's on the same grid (with and without act-order), and the checkpoint layout stays
standard: the same per-group scales and zero points, integers on the grid, groups contiguous."""

import pytest
import torch

from parley.models.quantize.awq import gram
from parley.models.quantize.gptq import gptq_round, upper_cholesky_of_inverse
from parley.models.quantize.pack import dequantize_int, group_params, quantize_int


def output_error(w, wq, x):
    return ((x @ (w - wq).t()) ** 2).mean().item()


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_lower_output_error_than_rtn_on_same_grid(act_order, seed):
    gen = torch.Generator().manual_seed(seed)
    out_f, in_f, group = 48, 128, 32
    w = torch.randn(out_f, in_f, generator=gen)
    # correlated inputs with a few loud channels, as a layer's activations are
    mix = torch.randn(in_f, in_f, generator=gen) / in_f ** 0.5 + torch.eye(in_f)
    x = torch.randn(2048, in_f, generator=gen) @ mix
    x[:, torch.randperm(in_f, generator=gen)[:4]] *= 8
    bounds = group_params(w, group)
    scales, zeros = bounds
    rtn = dequantize_int(quantize_int(w, scales, zeros, group), scales, zeros, group)

    q, s, z = gptq_round(w, gram(x), group, act_order=act_order)
    assert q.dtype == torch.int32 and q.shape == w.shape and int(q.min()) >= 0 and int(q.max()) <= 15
    torch.testing.assert_close(s, scales, atol=0, rtol=0)  # the grid is fixed before rounding
    torch.testing.assert_close(z, zeros, atol=0, rtol=0)
    err_gptq = output_error(w, dequantize_int(q, s, z, group), x)
    err_rtn = output_error(w, rtn, x)
    assert err_gptq < 0.8 * err_rtn, f"seed {seed}: GPTQ {err_gptq:.4g} vs RTN {err_rtn:.4g}"


def test_clipping_bounds_are_kept():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(16, 64, generator=gen)
    high = w.reshape(16, 2, 32).abs().amax(-1) * 0.6
    x = torch.randn(512, 64, generator=gen)
    q, s, z = gptq_round(w, gram(x), 32, (-high, high))
    deq = dequantize_int(q, s, z, 32)
    # the grid spans [-high, high] shifted by at most half a step (high / 15); fp16 scales round a little
    limit = high.repeat_interleave(32, 1) * (1 + 1 / 15) * (1 + 1e-3)
    assert (deq.abs() <= limit).all(), "seed 3"


def test_dead_input_channel():
    """A channel that is never active (zero Gram row) must not break the Cholesky factorisation."""
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(8, 32, generator=gen)
    x = torch.randn(256, 32, generator=gen)
    x[:, 5] = 0
    q, s, z = gptq_round(w, gram(x), 32)
    assert torch.isfinite(dequantize_int(q, s, z, 32)).all(), "seed 4"


@pytest.mark.parametrize("seed", [0, 1])
def test_upper_cholesky_of_inverse_is_the_references_factor(seed):
    """One Cholesky and one triangular inverse give the reference's factor (Cholesky, inverse, Cholesky again):
    U upper with U^T U = H^-1, and the same U, so GPTQ's error spreading is unchanged."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(300, 96, generator=g, dtype=torch.float64)
    h = x.T @ x + 0.1 * torch.eye(96, dtype=torch.float64)
    u = upper_cholesky_of_inverse(h)
    reference = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    assert torch.equal(u, torch.triu(u)), f"seed {seed}: not upper triangular"
    torch.testing.assert_close(u, reference, rtol=1e-9, atol=1e-12, msg=f"seed {seed}")
