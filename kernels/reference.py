"""The plain dequantize-then-matmul INT4 linear: the yardstick every fast path is tested against.

Layout (AutoAWQ "GEMM"): qweight int32 [in, out/8], qzeros int32 [in/group, out/8], scales [in/group, out].
Each int32 holds eight 4-bit values of eight output columns, in the interleaved order AutoAWQ packs:
nibble i (bits 4i..4i+3) of word c holds column 8c + AWQ_ORDER[i].

`mins` [in/group, out] (optional, fp16): a float offset per group, W = (q - z) * s + m. AWQ has none; GGUF's
Q4_1 and Q4_K are scale-and-minimum formats (w = d q + m), which this carries exactly (models/gguf_int4.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # column j of a word sits in nibble AWQ_REVERSE_ORDER[j]


def unpack_int4(packed: Tensor) -> Tensor:
    """int32 [rows, cols/8] -> uint8 values [rows, cols] in natural column order."""
    shifts = torch.arange(0, 32, 4, device=packed.device, dtype=torch.int32)
    nibbles = (packed.unsqueeze(-1) >> shifts) & 0xF  # [rows, cols/8, 8], nibble order
    order = torch.tensor(AWQ_REVERSE_ORDER, device=packed.device)
    return nibbles[..., order].reshape(packed.shape[0], -1).to(torch.uint8)


def dequantize(qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int,
               mins: Tensor | None = None) -> Tensor:
    """The weight as a dense [in, out] matrix in the scales' dtype."""
    w = unpack_int4(qweight).to(scales.dtype)
    z = unpack_int4(qzeros).to(scales.dtype)
    z = z.repeat_interleave(group_size, 0)[: w.shape[0]]
    s = scales.repeat_interleave(group_size, 0)[: w.shape[0]]
    if mins is None:
        return (w - z) * s
    return (w - z) * s + mins.to(scales.dtype).repeat_interleave(group_size, 0)[: w.shape[0]]


def int4_linear(x: Tensor, qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int,
                mins: Tensor | None = None) -> Tensor:
    """y = x @ W, W dequantized in x's dtype; x [..., in] -> y [..., out]."""
    w = dequantize(qweight, qzeros, scales.to(x.dtype), group_size, mins)
    return x @ w


def min_term(x: Tensor, mins: Tensor, group_size: int) -> Tensor:
    """x @ (each group's minimum repeated over its rows), computed as (x summed per group) @ mins: what the
    minimum adds to a product whose kernel reads only (q - z) * s. [..., in] -> [..., out] in x's dtype."""
    sums = x.reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size).float().sum(-1)
    return (sums @ mins.float()).to(x.dtype)
