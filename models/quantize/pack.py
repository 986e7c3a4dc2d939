"""Asymmetric INT4 group quantization and packing into the AutoAWQ "GEMM" layout.

The layout, as AutoAWQ's `WQLinear_GEMM` writes it (and vLLM / transformers read it):

- `qweight` int32 [in, out/8]: the integer weights transposed to [in, out]; every int32 holds eight 4-bit
  values of eight consecutive output columns 8c..8c+7, interleaved: nibble i (bits 4i..4i+3) of word c
  holds column 8c + AWQ_ORDER[i], AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7).
- `qzeros` int32 [in/group, out/8]: the integer zero point of each (group, column), packed the same way.
- `scales` fp16 [in/group, out]: the step of each (group, column).

A weight is `(q - zero) * scale`, where the group is `input_index // group_size`. Everything here works on
the nn.Linear orientation [out, in] and transposes only when packing.
"""

from __future__ import annotations

import torch
from torch import Tensor

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
MAX_INT = 15  # 4 bits, unsigned


Bounds = Tensor | tuple[Tensor, Tensor]  # per-group clipping range: max |w| (symmetric) or (low, high)


def _low_high(bounds: Bounds) -> tuple[Tensor, Tensor]:
    return bounds if isinstance(bounds, tuple) else (-bounds, bounds)


def group_params(w: Tensor, group_size: int, max_abs: Bounds | None = None) -> tuple[Tensor, Tensor]:
    """Per-group scales and integer zero points of w [out, in] -> both [out, in/group].

    `max_abs` [out, in/group] clips every group to [-max_abs, max_abs] first (the AWQ clipping search), or
    to [low, high] when it is a pair.
    Scales are rounded to fp16 here, since that is what the checkpoint stores: the integers are then
    chosen against the exact step the loader will multiply by.
    """
    out_f, in_f = w.shape
    g = w.float().reshape(out_f, in_f // group_size, group_size)
    hi, lo = g.amax(-1), g.amin(-1)
    if max_abs is not None:  # a clipped group's max is its max clamped to the range (clamping is monotone)
        low, high = _low_high(max_abs)
        hi, lo = hi.clamp(low.float(), high.float()), lo.clamp(low.float(), high.float())
    scales = ((hi - lo).clamp(min=1e-5) / MAX_INT).half().float()
    zeros = (-torch.round(lo / scales)).clamp(0, MAX_INT)
    return scales, zeros


def quantize_int(w: Tensor, scales: Tensor, zeros: Tensor, group_size: int) -> Tensor:
    """Integer weights q in [0, 15], int32 [out, in], for the given group scales and zero points."""
    out_f, in_f = w.shape
    g = w.float().reshape(out_f, in_f // group_size, group_size)
    q = (torch.round(g / scales[..., None]) + zeros[..., None]).clamp(0, MAX_INT)
    return q.reshape(out_f, in_f).to(torch.int32)


def clip(w: Tensor, max_abs: Bounds | None, group_size: int) -> Tensor:
    """w [out, in] clamped to its group's range (bounds [out, in/group]); None: unchanged."""
    if max_abs is None:
        return w
    low, high = (b.repeat_interleave(group_size, 1).to(w.dtype) for b in _low_high(max_abs))
    return torch.maximum(torch.minimum(w, high), low)


def _on_grid(w: Tensor, group_size: int, max_abs: Bounds | None) -> tuple[Tensor, Tensor, Tensor]:
    """(q, scales, zeros): q [out, in/group, group] the integers as fp32, in one buffer worked in place.

    The same arithmetic as group_params, clip and quantize_int (so the same values), without their
    temporaries: the clipping searches call this tens of times a layer on whole weight matrices, where each
    temporary is another pass over memory."""
    out_f, in_f = w.shape
    scales, zeros = group_params(w, group_size, max_abs)
    t = w.float().reshape(out_f, in_f // group_size, group_size)
    t = t.clone() if t.data_ptr() == w.data_ptr() else t
    if max_abs is not None:  # clipped as `clip` does: in the weights' own dtype
        low, high = _low_high(max_abs)
        t.clamp_(low.to(w.dtype).float()[..., None], high.to(w.dtype).float()[..., None])
    t.div_(scales[..., None]).round_().add_(zeros[..., None]).clamp_(0, MAX_INT)
    return t, scales, zeros


def fake_quantize(w: Tensor, group_size: int, max_abs: Bounds | None = None) -> Tensor:
    """w rounded to its INT4 grid and back, in w's dtype: what the quantized layer will compute with."""
    t, scales, zeros = _on_grid(w, group_size, max_abs)
    return t.sub_(zeros[..., None]).mul_(scales[..., None]).reshape(w.shape).to(w.dtype)


def dequantize_int(q: Tensor, scales: Tensor, zeros: Tensor, group_size: int) -> Tensor:
    """(q - zero) * scale in fp32, [out, in]."""
    out_f, in_f = q.shape
    g = q.float().reshape(out_f, in_f // group_size, group_size)
    return ((g - zeros[..., None]) * scales[..., None]).reshape(out_f, in_f)


def pack_columns(values: Tensor) -> Tensor:
    """int values in [0, 15], [rows, cols] (cols a multiple of 8) -> int32 [rows, cols/8] in AWQ order."""
    rows, cols = values.shape
    if cols % 8:
        raise ValueError(f"cannot pack {cols} columns: the AWQ GEMM layout needs a multiple of 8")
    v = values.to(torch.int64).reshape(rows, cols // 8, 8)
    packed = torch.zeros(rows, cols // 8, dtype=torch.int64, device=values.device)
    for nibble, column in enumerate(AWQ_ORDER):
        packed |= v[..., column] << (4 * nibble)
    # The top nibble reaches bit 31: reinterpret the unsigned 32-bit word as the int32 the format stores.
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)
    return packed.to(torch.int32)


def pack_awq(q: Tensor, scales: Tensor, zeros: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Integer weights [out, in] and group scales/zeros [out, in/group] -> (qweight, qzeros, scales fp16)."""
    qweight = pack_columns(q.t().contiguous())
    qzeros = pack_columns(zeros.t().contiguous().to(torch.int32))
    return qweight, qzeros, scales.t().contiguous().half()


def quantize_weight(w: Tensor, group_size: int, max_abs: Bounds | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """A linear's weight [out, in] -> AutoAWQ GEMM tensors (qweight, qzeros, scales)."""
    if w.shape[1] % group_size:
        raise ValueError(f"input size {w.shape[1]} is not a multiple of the group size {group_size}")
    q, scales, zeros = _on_grid(w, group_size, max_abs)
    return pack_awq(q.reshape(w.shape).to(torch.int32), scales, zeros)
