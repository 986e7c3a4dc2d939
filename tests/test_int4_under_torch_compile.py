"""Prepared INT4 weights and heads trace into `torch.compile(fullgraph=True)` with no graph break.

The engine compiles its whole decode step, so a kernel that broke the graph (a Python int from a tensor,
an untraceable launcher) would cost every token. On CUDA the compiled step also runs in CUDA graphs
("reduce-overhead"), which the Triton path must survive: it is one opaque op with no host syncs.
"""

from __future__ import annotations

import pytest
import torch

from parley import kernels
from parley.kernels import reference

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def awq_weight(K: int, N: int, group_size: int, device: str):
    gen = torch.Generator().manual_seed(0)
    qweight = torch.randint(-(2**31), 2**31 - 1, (K, N // 8), dtype=torch.int32, generator=gen)
    qzeros = torch.randint(-(2**31), 2**31 - 1, (K // group_size, N // 8), dtype=torch.int32, generator=gen)
    scales = (torch.rand(K // group_size, N, generator=gen) * 0.02 + 0.001).half()
    return qweight.to(device), qzeros.to(device), scales.to(device), group_size


@pytest.mark.parametrize("device", DEVICES)
def test_prepared_matmuls_compile_fullgraph(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARLEY_KERNELS", raising=False)
    torch._dynamo.reset()
    up_weight, down_weight = awq_weight(128, 256, 64, device), awq_weight(256, 128, 32, device)
    up, down = kernels.prepare(*up_weight), kernels.prepare(*down_weight)
    head = kernels.prepare_head(torch.randn(512, 128, device=device) * 0.05)

    def step(x: torch.Tensor) -> torch.Tensor:
        return head.matmul(x + down.matmul(torch.relu(up.matmul(x))))

    mode = "reduce-overhead" if device == "cuda" else None
    compiled = torch.compile(step, fullgraph=True, mode=mode)
    for _ in range(3):  # CUDA graphs are recorded on a later call than the first
        x = torch.randn(1, 1, 128, device=device)
        assert torch.allclose(compiled(x), step(x), rtol=1e-2, atol=1e-2)

    h = torch.relu(reference.int4_linear(x.float(), *up_weight[:2], up_weight[2].float(), 64))
    y = x + reference.int4_linear(h, *down_weight[:2], down_weight[2].float(), 32)
    assert (step(x) - head.matmul(y)).abs().max() <= 0.05 * head.matmul(y).abs().max()
