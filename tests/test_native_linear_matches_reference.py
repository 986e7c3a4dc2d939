"""The native step's products equal an independent float64 computation of the same arithmetic.

INT4 weights (AWQ layout, several group sizes, with and without bias) times activations quantized to int8
in blocks of 64 or 32 (the product's `act_block`), and the int8 output head (blocks of 32), through the
library's own `parley_linear` entry point. Pins the nibble layout, the zero points, the per-block activation scales (a
reference with the other block size fails), the gate/up interleave and the bias.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from parley.kernels import native
from parley.models import native_forward
from parley.models.native_step import _interleave16

lib = native_forward.library()
pytestmark = pytest.mark.skipif(lib is None, reason=f"native step unavailable: {native_forward.why_unavailable()}")


def quantize_acts_ref(x: torch.Tensor, block: int) -> torch.Tensor:
    """x [M, K] -> its int8-per-block reconstruction, in float64 (round half to even, as nearbyint)."""
    b = x.double().reshape(x.shape[0], -1, block)
    d = (b.abs().amax(-1) / 127).float().double()  # the scale is an fp32 number in the library
    inv = torch.where(d > 0, 1 / d.float(), torch.zeros_like(d.float())).double()
    q = torch.round((b.float() * inv.float()[..., None]).double()).clamp(-127, 127)
    return (q * d[..., None]).reshape(x.shape)


def run_linear(L: native.Lin, x: torch.Tensor) -> torch.Tensor:
    y = torch.empty(x.shape[0], L.N)
    rc = lib.parley_linear(ctypes.byref(L), x.shape[0], x.contiguous().data_ptr(), y.data_ptr())
    assert rc == 0
    return y


@pytest.mark.parametrize("act_block", [64, 32])
@pytest.mark.parametrize("group", [64, 128])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("M", [1, 3, 5, 17])
def test_int4_linear_matches_float64(act_block: int, group: int, bias: bool, M: int) -> None:
    seed = 1000 + group + 7 * M + bias + act_block
    g = torch.Generator().manual_seed(seed)
    K, N = 256, 44  # N not a multiple of the 16-column block: the padded last block runs too
    q = torch.randint(0, 16, (K, N), generator=g)
    z = torch.randint(0, 16, (K // group, N), generator=g).float()
    s = (torch.rand(K // group, N, generator=g) * 0.02 + 0.001).half().float()
    b = torch.randn(N, generator=g) if bias else None
    x = torch.randn(M, K, generator=g) * 3
    x[0, 5] = 40.0  # an outlier in one block
    packed = native.pack_q4(q, z, s, group)
    L = native.lin(native.W_Q4, N, K, group, q=packed["q"], s16=packed["s16"], z=packed["z"], bias=b,
                   act_block=act_block)
    y = run_linear(L, x)
    w = (q.double() - z.double().repeat_interleave(group, 0)) * s.double().repeat_interleave(group, 0)
    ref = quantize_acts_ref(x, act_block) @ w + (b.double() if bias else 0)
    err = (y.double() - ref).abs().max().item()
    assert err < 1e-4 * ref.abs().max().item(), f"seed={seed}: max error {err}"


def test_int8_head_matches_float64() -> None:
    seed = 7
    g = torch.Generator().manual_seed(seed)
    N, K = 37, 192
    w = torch.randn(N, K, generator=g)
    x = torch.randn(4, K, generator=g)
    h = native.pack_q8(w)
    L = native.lin(native.W_Q8, N, K, 0, q=h["q"], s=h["s"])
    y = run_linear(L, x)
    q8, scale = native.quantize_q8_rows(w)
    wq = q8.double() * scale.double()[:, None]
    ref = quantize_acts_ref(x, 32) @ wq.t()
    err = (y.double() - ref).abs().max().item()
    assert err < 1e-4 * ref.abs().max().item(), f"seed={seed}: max error {err}"


def test_rows_are_bitwise_independent_of_the_pass_length() -> None:
    """Row i of a 17-row product equals the same row computed alone (tiles never reorder a row's sums)."""
    g = torch.Generator().manual_seed(3)
    K, N, group = 128, 64, 64
    packed = native.pack_q4(torch.randint(0, 16, (K, N), generator=g), torch.randint(0, 16, (2, N), generator=g),
                            (torch.rand(2, N, generator=g) * 0.01).half().float(), group)
    L = native.lin(native.W_Q4, N, K, group, q=packed["q"], s16=packed["s16"], z=packed["z"])
    x = torch.randn(17, K, generator=g)
    full = run_linear(L, x)
    for i in range(17):
        assert torch.equal(run_linear(L, x[i : i + 1])[0], full[i]), f"row {i} differs"


def test_gate_up_interleave_pairs_columns() -> None:
    a = torch.arange(32 * 3).reshape(32, 3)
    b = -a
    out = _interleave16(a, b)
    assert torch.equal(out[:16], a[:16]) and torch.equal(out[16:32], b[:16]) and torch.equal(out[32:48], a[16:])


def test_scales_that_are_not_fp16_numbers_are_refused() -> None:
    """The packed layout keeps scales in fp16 (3 bytes per group with the zero point): a scale fp16 cannot
    hold must be refused (the model then runs on the PyTorch path), never silently rounded."""
    q, z = torch.zeros(64, 16, dtype=torch.long), torch.zeros(1, 16)
    with pytest.raises(ValueError, match="fp16"):
        native.pack_q4(q, z, torch.full((1, 16), 0.1), 64)
