"""The native step's INT4 products in GGUF's shape: groups of 32 inputs and a float minimum per group
(w = (q - z) s + m, Q4_1 and Q4_K), equal to an independent float64 computation of the same arithmetic.

Pins that each half of a 64-input chunk reads its own group's scale, zero point and minimum (a kernel that
used one group per chunk, or dropped the minimum, fails); test_native_portable_loops.py runs it on the
portable loops too where this machine builds the AVX-512 ones."""

from __future__ import annotations

import ctypes

import pytest
import torch
from test_native_linear_matches_reference import quantize_acts_ref

from parley.kernels import native
from parley.models import native_forward

lib = native_forward.library()
pytestmark = pytest.mark.skipif(lib is None, reason=f"native step unavailable: {native_forward.why_unavailable()}")


def run(L: native.Lin, x: torch.Tensor, library: ctypes.CDLL) -> torch.Tensor:
    y = torch.empty(x.shape[0], L.N)
    assert library.parley_linear(ctypes.byref(L), x.shape[0], x.contiguous().data_ptr(), y.data_ptr()) == 0
    return y


def weights(seed: int, K: int, N: int, group: int, with_mins: bool):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (K, N), generator=g)
    z = torch.randint(0, 16, (K // group, N), generator=g).float() * (0 if with_mins else 1)
    s = (torch.rand(K // group, N, generator=g) * 0.02 + 0.001).half().float()
    m = (-(torch.rand(K // group, N, generator=g) * 0.15)).half().float() if with_mins else None
    return g, q, z, s, m


@pytest.mark.parametrize("with_mins", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("M", [1, 3, 8, 17])
def test_groups_of_32_with_minimums_match_float64(with_mins: bool, bias: bool, M: int) -> None:
    seed = 2000 + 7 * M + 2 * bias + with_mins
    K, N, group = 256, 44, 32
    g, q, z, s, m = weights(seed, K, N, group, with_mins)
    b = torch.randn(N, generator=g) if bias else None
    x = torch.randn(M, K, generator=g) * 3
    x[0, 37] = 40.0  # an outlier in one block
    packed = native.pack_q4(q, z, s, group, m)
    L = native.lin(native.W_Q4, N, K, group, q=packed["q"], s16=packed["s16"], z=packed["z"], bias=b,
                   act_block=32, m16=packed.get("m16"))
    w = (q.double() - z.double().repeat_interleave(group, 0)) * s.double().repeat_interleave(group, 0)
    if m is not None:
        w = w + m.double().repeat_interleave(group, 0)
    ref = quantize_acts_ref(x, 32) @ w + (b.double() if bias else 0)
    y = run(L, x, lib)
    err = (y.double() - ref).abs().max().item()
    assert err < 1e-4 * ref.abs().max().item(), f"seed={seed}: max error {err}"


def test_minimums_on_a_group_of_64() -> None:
    """A minimum per group of 64 (not a GGUF shape, but the layout allows it) is read once per chunk."""
    seed = 2100
    K, N, group = 192, 32, 64
    g, q, z, s, m = weights(seed, K, N, group, True)
    x = torch.randn(5, K, generator=g)
    packed = native.pack_q4(q, z, s, group, m)
    L = native.lin(native.W_Q4, N, K, group, q=packed["q"], s16=packed["s16"], z=packed["z"], act_block=32,
                   m16=packed["m16"])
    w = q.double() * s.double().repeat_interleave(group, 0) + m.double().repeat_interleave(group, 0)
    ref = quantize_acts_ref(x, 32) @ w
    err = (run(L, x, lib).double() - ref).abs().max().item()
    assert err < 1e-4 * ref.abs().max().item(), f"seed={seed}: max error {err}"


def test_groups_of_32_need_activation_blocks_of_32() -> None:
    q, z, s = torch.zeros(64, 16, dtype=torch.long), torch.zeros(2, 16), torch.ones(2, 16)
    packed = native.pack_q4(q, z, s, 32)
    with pytest.raises(ValueError, match="blocks of 32"):
        native.lin(native.W_Q4, 16, 64, 32, q=packed["q"], s16=packed["s16"], z=packed["z"], act_block=64)
    with pytest.raises(ValueError, match="fp16"):
        native.pack_q4(q, z, s, 32, torch.full((2, 16), 0.1))
