"""The CPU fast paths: torch's weight-only int4 and int8 matmul ops, fed bf16 activations.

Why these ops (`parley bench kernels --candidates`, 2-core EPYC): on the embedded model's layer shapes
`_weight_int4pack_mm_for_cpu` runs ~1.5-3x faster than the fp32 dense product at M = 1..9 once a layer
has more than a few hundred thousand weights, and ~1.5x at prefill, but only with bf16 activations: with
fp32 or fp16 activations the same op is ~10-50x slower. So activations are cast to bf16 on the way in and
back to the caller's dtype on the way out (an engine running bf16 activations skips both casts). A dense
bf16 copy is faster at prefill but holds 4x the bytes; an int8 copy of an INT4 weight is no faster.

The op's weight format differs from AWQ's: it stores q in [N, K] order (repacked by
`_convert_weight_to_int4pack_for_cpu`), needs N to be a multiple of 16, and dequantizes as
`(q - 8) * scale + offset` with `qScaleAndZeros[K/group, N, 2] = (scale, offset)`. AWQ's
`(q - z) * s` is the same thing with `offset = (8 - z) * s`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .reference import unpack_int4

COMPUTE_DTYPE = torch.bfloat16
INT4_GROUP_SIZES = (32, 64, 128, 256)


class CpuInt4Linear:
    """An INT4 weight repacked once for `torch.ops.aten._weight_int4pack_mm_for_cpu`."""

    def __init__(self, q: Tensor, zeros: Tensor, scales: Tensor, group_size: int,
                 mins: Tensor | None = None) -> None:
        """q [K, N] ints in 0..15, zeros and scales [K/group, N]; W = (q - zeros) * scales (+ mins) per group."""
        if group_size not in INT4_GROUP_SIZES:
            raise ValueError(f"torch's CPU int4 op takes group sizes {INT4_GROUP_SIZES}, not {group_size}")
        K, N = q.shape
        if K % group_size:
            raise ValueError(f"in_features {K} is not a multiple of the group size {group_size}")
        self.in_features, self.out_features, self.group_size = K, N, group_size
        pad = -N % 16  # the op tiles N by 16; padded columns have zero scale, so they come out as 0
        s = torch.nn.functional.pad(scales.float(), (0, pad))
        z = torch.nn.functional.pad(zeros.float(), (0, pad))
        q = torch.nn.functional.pad(q.to(torch.int32), (0, pad))
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.t().contiguous(), 1)
        offset = (8 - z) * s
        if mins is not None:  # a float minimum per group is part of the op's own offset
            offset = offset + torch.nn.functional.pad(mins.float(), (0, pad))
        self.scales_and_zeros = torch.stack([s, offset], dim=-1).to(COMPUTE_DTYPE).contiguous()

    @classmethod
    def from_awq(cls, qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int,
                 mins: Tensor | None = None) -> CpuInt4Linear:
        return cls(unpack_int4(qweight), unpack_int4(qzeros), scales, group_size, mins)

    def matmul(self, x: Tensor) -> Tensor:
        """x [..., K] -> [..., N] in x's dtype."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).to(COMPUTE_DTYPE).contiguous()
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed, self.group_size, self.scales_and_zeros)
        if y.shape[-1] != self.out_features:
            y = y[:, : self.out_features]
        return y.to(x.dtype).reshape(*lead, self.out_features)


class CpuInt8Linear:
    """A dense weight quantized to int8 per output row (symmetric) for `aten._weight_int8pack_mm`.

    Used for the output head: a weight-only int8 copy of a [V, K] matrix is ~11x faster than fp32 at M = 1
    here and its rounding error (half a step of max|row|/127) barely moves logits.
    """

    def __init__(self, weight: Tensor) -> None:
        """weight [N, K] as nn.Linear stores it."""
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127
        self.weight = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        self.scales = scale.to(COMPUTE_DTYPE)

    def matmul(self, x: Tensor) -> Tensor:
        """x [..., K] -> [..., N] in fp32 (logits are consumed in fp32 by sampling)."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).to(COMPUTE_DTYPE).contiguous()
        y = torch.ops.aten._weight_int8pack_mm(x2, self.weight, self.scales)
        return y.float().reshape(*lead, self.out_features)


def quantize_rtn_int4(weight: Tensor, group_size: int) -> CpuInt4Linear:
    """Round-to-nearest asymmetric INT4 of a dense [N, K] weight, for a head that can afford more error."""
    w = weight.detach().float().t()  # [K, N]
    K, N = w.shape
    g = w.reshape(K // group_size, group_size, N)
    lo, hi = g.amin(dim=1), g.amax(dim=1)
    scales = ((hi - lo) / 15).clamp(min=1e-12)
    zeros = torch.round(-lo / scales).clamp(0, 15)
    q = torch.round(g / scales[:, None] + zeros[:, None]).clamp(0, 15).reshape(K, N)
    return CpuInt4Linear(q, zeros, scales, group_size)
