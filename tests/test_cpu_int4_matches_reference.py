"""The CPU INT4 path (torch's int4 weight-only op on bf16 activations) agrees with the reference.

Odd shapes on purpose: N a multiple of 8 but not of 16 (the op pads N), K an odd multiple of the group.
"""

from __future__ import annotations

import pytest
import torch

from parley.kernels import reference
from parley.kernels.cpu_int4 import CpuInt4Linear

BF16_TOLERANCE = 1.5e-2  # bf16 activations and scales: a few ulps relative to max|y|


def awq_weight(K: int, N: int, group_size: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    qweight = torch.randint(-(2**31), 2**31 - 1, (K, N // 8), dtype=torch.int32, generator=gen)
    qzeros = torch.randint(-(2**31), 2**31 - 1, (K // group_size, N // 8), dtype=torch.int32, generator=gen)
    scales = (torch.rand(K // group_size, N, generator=gen) * 0.02 + 0.001).half()
    return qweight, qzeros, scales


@pytest.mark.parametrize("M", [1, 5, 33])
@pytest.mark.parametrize(("K", "N", "group_size"), [(96, 40, 32), (192, 200, 64), (384, 24, 128), (1536, 576, 64)])
def test_cpu_path_matches_reference(M: int, K: int, N: int, group_size: int) -> None:
    qweight, qzeros, scales = awq_weight(K, N, group_size, seed=M + K + N)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M))
    y = CpuInt4Linear.from_awq(qweight, qzeros, scales, group_size).matmul(x)
    ref = reference.int4_linear(x, qweight, qzeros, scales.float(), group_size)
    assert y.dtype == torch.float32 and y.shape == (M, N)
    error = ((y - ref).abs().max() / ref.abs().max()).item()
    assert error <= BF16_TOLERANCE, f"relative error {error:.2e}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_output_keeps_input_dtype_and_leading_shape(dtype: torch.dtype) -> None:
    qweight, qzeros, scales = awq_weight(128, 48, 32, seed=0)
    x = torch.randn(2, 3, 128).to(dtype)
    y = CpuInt4Linear.from_awq(qweight, qzeros, scales, 32).matmul(x)
    ref = reference.int4_linear(x.float(), qweight, qzeros, scales.float(), 32)
    assert y.dtype == dtype and y.shape == (2, 3, 48)
    assert ((y.float() - ref).abs().max() / ref.abs().max()).item() <= BF16_TOLERANCE


def test_unsupported_group_size_is_refused() -> None:
    qweight, qzeros, scales = awq_weight(96, 16, 16, seed=0)
    with pytest.raises(ValueError, match="group sizes"):
        CpuInt4Linear.from_awq(qweight, qzeros, scales, 16)
