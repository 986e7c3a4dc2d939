"""`kernels.prepare_gate_up` (the fused [gate | up] weight, SiLU * up in one step) and
`kernels.fuse_columns` (q|k|v in one weight) compute what the separate projections do."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from parley import kernels
from parley.kernels import reference

SEED = 21


def awq(K: int, N: int, group: int, gen: torch.Generator):
    qweight = torch.randint(-(2**31), 2**31 - 1, (K, N // 8), dtype=torch.int32, generator=gen)
    qzeros = torch.randint(-(2**31), 2**31 - 1, (K // group, N // 8), dtype=torch.int32, generator=gen)
    return qweight, qzeros, torch.rand(K // group, N, generator=gen) * 0.02 + 0.001


@pytest.mark.parametrize("kernel_path", ["auto", "reference"])
def test_gate_up_equals_silu_gate_times_up(kernel_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARLEY_KERNELS", kernel_path)
    gen = torch.Generator().manual_seed(SEED)
    gate, up = awq(128, 96, 64, gen), awq(128, 96, 64, gen)
    x = torch.randn(3, 5, 128, generator=gen)
    expected = F.silu(reference.int4_linear(x, *gate, 64)) * reference.int4_linear(x, *up, 64)
    got = kernels.prepare_gate_up(gate, up, 64).matmul(x)
    assert got.shape == (3, 5, 96)
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2, msg=f"seed {SEED}")


def test_fused_columns_split_back_into_the_parts() -> None:
    gen = torch.Generator().manual_seed(SEED)
    parts = [awq(64, n, 32, gen) for n in (64, 16, 16)]
    fused = kernels.fuse_columns(parts)
    x = torch.randn(4, 64, generator=gen)
    outs = reference.int4_linear(x, *fused, 32).split([64, 16, 16], dim=-1)
    for out, part in zip(outs, parts, strict=True):
        assert torch.equal(out, reference.int4_linear(x, *part, 32))
    with pytest.raises(ValueError, match="multiple of 8"):
        kernels.fuse_columns([awq(64, 8, 32, gen), (parts[0][0], parts[0][1], torch.zeros(2, 12))])
