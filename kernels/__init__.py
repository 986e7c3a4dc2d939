"""INT4 matmul on the AutoAWQ GEMM layout. Pure functions on tensors; no model knowledge.

Dispatch by the weight's device: CUDA -> Triton kernels (`triton_int4`), CPU -> torch's weight-only int4 op
(`cpu_int4`). `PARLEY_KERNELS=reference` forces the plain dequantize-then-matmul everywhere, for debugging.

Hot paths call `prepare(...)` once at load time and `.matmul(x)` per step: the CPU op needs its own
repacked layout, which `int4_linear` would otherwise rebuild on every call.
"""

from __future__ import annotations

import os
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from . import reference
from .cpu_int4 import INT4_GROUP_SIZES, CpuInt4Linear, CpuInt8Linear, quantize_rtn_int4
from .reference import dequantize

__all__ = ["Matmul", "backend", "dequantize", "fuse_columns", "int4_linear", "prepare", "prepare_gate_up",
           "prepare_head"]


class Matmul(Protocol):
    """What `prepare` and `prepare_head` return: a weight in the layout its device reads best."""

    def matmul(self, x: Tensor) -> Tensor: ...


def backend(device: torch.device | str) -> str:
    """'reference', 'triton' or 'cpu': the path taken for weights on `device` (others: the reference)."""
    forced = os.environ.get("PARLEY_KERNELS", "auto").strip().lower()
    if forced == "reference":
        return "reference"
    if forced not in ("", "auto"):
        raise ValueError(f"PARLEY_KERNELS must be 'auto' or 'reference', not {forced!r}")
    kind = torch.device(device).type
    return {"cuda": "triton", "cpu": "cpu"}.get(kind, "reference")


class ReferenceInt4Linear:
    """The AWQ tensors as they are; every call dequantizes the whole weight (slow, obviously right)."""

    def __init__(self, qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int,
                 mins: Tensor | None = None) -> None:
        self.qweight, self.qzeros, self.scales, self.group_size = qweight, qzeros, scales, group_size
        self.mins = mins

    def matmul(self, x: Tensor) -> Tensor:
        return reference.int4_linear(x, self.qweight, self.qzeros, self.scales, self.group_size, self.mins)


class WithMins:
    """A product over (q - z) * s plus each group's float minimum, added as (x summed per group) @ mins: the
    Triton kernels read AWQ's integer zero points only, and the minimum's share is a matmul 1/group the size."""

    def __init__(self, inner: Matmul, mins: Tensor, group_size: int) -> None:
        self.inner, self.mins, self.group_size = inner, mins.contiguous(), group_size

    def matmul(self, x: Tensor) -> Tensor:
        return self.inner.matmul(x) + reference.min_term(x, self.mins, self.group_size)


class TritonInt4Linear:
    """The AWQ tensors as they are: the Triton kernels read AWQ's layout directly."""

    def __init__(self, qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int) -> None:
        from . import triton_int4  # imported only where Triton is needed: CPU-only installs lack it

        self._mm = triton_int4.int4_mm
        self.qweight, self.qzeros = qweight.contiguous(), qzeros.contiguous()
        self.scales, self.group_size = scales.contiguous(), group_size
        triton_int4.gemv_workspace(qweight.device, scales.shape[1])  # now, not inside graph capture

    def matmul(self, x: Tensor) -> Tensor:
        lead, K = x.shape[:-1], x.shape[-1]
        # The kernels take fp16/bf16; fp32 activations run in the scales' dtype.
        compute = x.dtype if x.dtype in (torch.float16, torch.bfloat16) else self.scales.dtype
        y = self._mm(x.reshape(-1, K).to(compute), self.qweight, self.qzeros, self.scales, self.group_size)
        return y.to(x.dtype).reshape(*lead, y.shape[-1])


def prepare(qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int,
            mins: Tensor | None = None) -> Matmul:
    """The AWQ weight repacked for its device's fast path; `.matmul(x)` maps x [..., K] -> [..., N].
    `mins` [K/group, N]: a float offset per group (W = (q - z) * s + m; see reference.py).

    A group size torch's CPU op lacks falls back to the reference rather than failing to load.
    """
    kind = backend(qweight.device)
    if kind == "reference" or (kind == "cpu" and group_size not in INT4_GROUP_SIZES):
        return ReferenceInt4Linear(qweight, qzeros, scales, group_size, mins)
    if kind == "triton":
        mm = TritonInt4Linear(qweight, qzeros, scales, group_size)
        return mm if mins is None else WithMins(mm, mins, group_size)
    return CpuInt4Linear.from_awq(qweight, qzeros, scales, group_size, mins)


def fuse_columns(weights: list[tuple[Tensor, Tensor, Tensor]]) -> tuple[Tensor, Tensor, Tensor]:
    """AWQ weights (qweight, qzeros, scales) with the same K and group side by side along N: q|k|v or
    gate|up read in one launch. Each part's N must be a multiple of 8 (no packed word straddles two)."""
    if any(scales.shape[1] % 8 for _, _, scales in weights):
        raise ValueError("fuse_columns needs every part's N to be a multiple of 8")
    qweight, qzeros, scales = (torch.cat(parts, dim=1).contiguous() for parts in zip(*weights, strict=True))
    return qweight, qzeros, scales


class GateUp:
    """SiLU(x @ W_gate) * (x @ W_up) from the fused [gate | up] weight. On CUDA one skinny-kernel launch
    with the product in its epilogue (M <= 16); elsewhere the fused matmul, then SiLU and the product."""

    def __init__(self, qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int) -> None:
        self.fused = prepare(qweight, qzeros, scales, group_size)

    def matmul(self, x: Tensor) -> Tensor:
        if isinstance(self.fused, TritonInt4Linear):
            from .triton_int4 import int4_silu_mul

            f = self.fused
            lead, K = x.shape[:-1], x.shape[-1]
            compute = x.dtype if x.dtype in (torch.float16, torch.bfloat16) else f.scales.dtype
            y = int4_silu_mul(x.reshape(-1, K).to(compute), f.qweight, f.qzeros, f.scales, f.group_size)
            return y.to(x.dtype).reshape(*lead, y.shape[-1])
        gate, up = self.fused.matmul(x).chunk(2, dim=-1)
        return F.silu(gate) * up


def prepare_gate_up(gate: tuple[Tensor, Tensor, Tensor], up: tuple[Tensor, Tensor, Tensor],
                    group_size: int) -> Matmul:
    """An MLP's gate and up projections as one weight whose `.matmul(x)` is SiLU(x W_gate) * (x W_up)."""
    return GateUp(*fuse_columns([gate, up]), group_size)


def int4_linear(x: Tensor, qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int,
                mins: Tensor | None = None) -> Tensor:
    """y = x @ W for an AWQ INT4 weight, in x's dtype. Repacks on every call on CPU: prefer `prepare`."""
    return prepare(qweight, qzeros, scales, group_size, mins).matmul(x)


class DenseHead:
    """A dense head in a narrower dtype, returning fp32 logits."""

    def __init__(self, weight: Tensor, dtype: torch.dtype) -> None:
        self.weight = weight.detach().to(dtype).contiguous()

    def matmul(self, x: Tensor) -> Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight).float()


def prepare_head(weight: Tensor, bits: int = 8) -> Matmul:
    """A fast output projection for a dense [vocab, hidden] weight; `.matmul(x)` returns fp32 logits.

    On CPU, bits=8 is weight-only int8 per row, bits=4 round-to-nearest INT4 (group 32), bits=16 bf16.
    On CUDA the head is kept dense in bf16 (it is read once per step; fp32 would double the bytes).
    PARLEY_KERNELS=reference keeps it exact in fp32.
    """
    kind = backend(weight.device)
    if kind == "reference":
        return DenseHead(weight, torch.float32)
    if kind == "triton" or bits == 16:
        return DenseHead(weight, torch.bfloat16)
    if bits == 8:
        return CpuInt8Linear(weight)
    if bits == 4:
        return quantize_rtn_int4(weight, 32)
    raise ValueError(f"prepare_head takes bits 4, 8 or 16, not {bits}")
