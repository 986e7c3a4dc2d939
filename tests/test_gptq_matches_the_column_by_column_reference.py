"""GPTQ's blocked loop (columns 32 at a time, in place, on transposed copies) rounds as the algorithm's plain
statement does: every column in turn, rounded on the fixed grid, its error divided by its pivot and pushed onto
every later column through its row of the upper Cholesky factor of H^-1, here in float64. Float32 against
float64 moves a tie now and then, so a few integers may differ; a step left out or misplaced (an error pushed
onto the block's later columns only, or not at all, a wrong pivot) changes thousands."""

from __future__ import annotations

import pytest
import torch

from parley.models.quantize.awq import gram
from parley.models.quantize.gptq import gptq_round
from parley.models.quantize.pack import MAX_INT, group_params


def reference(w: torch.Tensor, h: torch.Tensor, group: int, act_order: bool, damp: float = 0.01) -> torch.Tensor:
    scales, zeros = group_params(w, group)
    s, z = scales.double().repeat_interleave(group, 1), zeros.double().repeat_interleave(group, 1)
    w, h = w.double().clone(), h.double().clone()
    order = torch.argsort(h.diagonal().float(), descending=True) if act_order else torch.arange(w.shape[1])
    w, h, s, z = w[:, order], h[order][:, order], s[:, order], z[:, order]
    h.diagonal().add_(damp * h.diagonal().mean())
    u = torch.linalg.cholesky(torch.linalg.inv(h), upper=True)  # H^-1 = U^T U
    q = torch.empty_like(w)
    for c in range(w.shape[1]):
        q[:, c] = (torch.round(w[:, c] / s[:, c]) + z[:, c]).clamp(0, MAX_INT)
        e = (w[:, c] - (q[:, c] - z[:, c]) * s[:, c]) / u[c, c]
        w[:, c:] -= torch.outer(e, u[c, c:])
    return q[:, torch.argsort(order)].to(torch.int32)


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_blocked_rounding_is_the_column_by_column_one(act_order: bool, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    out_f, in_f, group = 96, 256, 64  # 8 blocks of 32 columns
    w = torch.randn(out_f, in_f, generator=gen)
    mix = torch.randn(in_f, in_f, generator=gen) / in_f ** 0.5 + torch.eye(in_f)
    x = torch.randn(1024, in_f, generator=gen) @ mix
    x[:, torch.randperm(in_f, generator=gen)[:4]] *= 8
    h = gram(x)
    q, _, _ = gptq_round(w, h, group, act_order=act_order)
    want = reference(w, h, group, act_order)
    differ = int((q != want).sum())
    assert differ <= q.numel() // 1000, f"seed {seed}: {differ} of {q.numel()} integers differ from the reference"
