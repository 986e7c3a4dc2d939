"""The int8 head is packed a block of rows at a time (bounded temporaries for a 128k x 4096 head): the layout is
exactly the one the whole matrix packed at once gives, at a ragged row count too."""

from __future__ import annotations

import pytest
import torch

from parley.kernels import native

SEED = 0


def whole(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """The layout's definition: per 16 rows and 64 inputs, 16 vectors of 64 bytes, byte 4n + j of vector t is
    q[n][4t + j] + 128; rows padded to 16 with zeros."""
    q, scale = native.quantize_q8_rows(weight)
    N, K = q.shape
    Np = (N + 15) // 16 * 16
    q = torch.cat([q, q.new_zeros(Np - N, K)])
    u = (q.to(torch.int16) + 128).to(torch.uint8)
    return {"q": u.reshape(Np // 16, 16, K // 64, 16, 4).permute(0, 2, 3, 1, 4).contiguous(), "s": scale}


@pytest.mark.parametrize("rows", [70, 96, 16])
def test_blocks_of_rows_pack_as_the_whole(rows: int, monkeypatch) -> None:
    monkeypatch.setattr(native, "Q8_ROWS", 32)
    g = torch.Generator().manual_seed(SEED)
    weight = torch.randn(rows, 128, generator=g) * torch.rand(rows, 1, generator=g)
    got, want = native.pack_q8(weight), whole(weight)
    assert torch.equal(got["s"], want["s"]), f"seed {SEED}"
    assert torch.equal(got["q"], want["q"]), f"seed {SEED}"
