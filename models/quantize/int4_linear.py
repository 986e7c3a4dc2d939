"""`Int4Linear`: a drop-in for nn.Linear holding AutoAWQ GEMM tensors, the module swap of the INT4 model.

The model code never knows it is quantized: AWQ (`awq.py`) and the loader (`loading.assemble`) put these
in place of the decoder layers' linears (the output head and embeddings stay in floating point, as AutoAWQ
leaves them) and the forward calls the kernels, which own speed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ... import kernels
from ..read_on_use import ReadOnUse
from .pack import Bounds, pack_awq, quantize_weight

Q4Rows = tuple[Tensor, Tensor, Tensor, Tensor | None]  # Int4Linear.q4_rows
RowsReader = Callable[[], Q4Rows]

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class Int4Linear(ReadOnUse, nn.Module):
    """y = x @ dequant(qweight) + bias, weights in the AutoAWQ GEMM layout (see pack.py).

    `mins=True`: a float minimum per group too, W = (q - z) * s + m (fp16 [in/group, out]), the form of
    GGUF's Q4_1 and Q4_K blocks, imported as they are (models/gguf_int4.py); AWQ checkpoints have none.
    On the CPU the loader leaves the stored tensors unread until used (models/read_on_use.py)."""

    ON_USE = ("qweight", "qzeros", "scales", "mins")

    def __init__(self, in_features: int, out_features: int, group_size: int, bias: bool = False,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float16,
                 mins: bool = False) -> None:
        super().__init__()
        if in_features % group_size or out_features % 8:
            raise ValueError(f"Int4Linear({in_features}, {out_features}) needs in % group_size "
                             f"({group_size}) == 0 and out % 8 == 0")
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        n_groups = in_features // group_size
        self.register_buffer("qweight", torch.zeros(in_features, out_features // 8, dtype=torch.int32,
                                                    device=device))
        self.register_buffer("qzeros", torch.zeros(n_groups, out_features // 8, dtype=torch.int32,
                                                   device=device))
        self.register_buffer("scales", torch.zeros(n_groups, out_features, dtype=torch.float16, device=device))
        if bias:
            self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device))
        else:
            self.bias = None
        if mins:
            self.register_buffer("mins", torch.zeros(n_groups, out_features, dtype=torch.float16, device=device))
        else:
            self.mins = None
        self._prepared: Any = None  # the kernels' repacked form, built on first use

    @classmethod
    def from_linear(cls, linear: nn.Module, group_size: int, max_abs: Bounds | None = None) -> Int4Linear:
        """Quantize an nn.Linear, or the engine's CPU TransposedLinear (its weight clipped per group to
        `max_abs` first, when given)."""
        w = linear.weight.data if hasattr(linear, "weight") else linear.weight_t.data.t()
        m = cls(linear.in_features, linear.out_features, group_size, linear.bias is not None,
                device=w.device, dtype=w.dtype)
        m.qweight, m.qzeros, m.scales = quantize_weight(w, group_size, max_abs)
        if linear.bias is not None:
            m.bias = linear.bias.data.clone()
        return m

    @classmethod
    def from_int(cls, q: Tensor, scales: Tensor, zeros: Tensor, group_size: int,
                 bias: Tensor | None = None) -> Int4Linear:
        """From integer weights q [out, in] and their group scales / zero points [out, in/group] (GPTQ's)."""
        out_f, in_f = q.shape
        m = cls(in_f, out_f, group_size, bias is not None, device=q.device,
                dtype=bias.dtype if bias is not None else torch.float16)
        m.qweight, m.qzeros, m.scales = pack_awq(q, scales, zeros)
        if bias is not None:
            m.bias = bias.detach().clone()
        return m

    @property
    def has_mins(self) -> bool:
        return "mins" in self._buffers

    def read_on_use(self, read: Callable[[], dict[str, Tensor]], rows: RowsReader | None = None) -> None:
        """`ReadOnUse.read_on_use`; `rows` reads the checkpoint's integers as `q4_rows` gives them, where the
        checkpoint stores them so (a GGUF's 4-bit blocks)."""
        super().read_on_use(read)
        self.__dict__["_read_rows"] = rows

    def q4_rows(self) -> Q4Rows:
        """(q uint8 [out, in], zero points, scales, minimums [out, in/group]; minimums None where it has none):
        the integers row by row, what the native step packs. A module not yet read, whose checkpoint stores
        that form, reads it from there without a round trip through the AWQ packing (a GGUF's 4-bit blocks:
        that round trip was most of a start's time)."""
        rows = self.__dict__.get("_read_rows")
        if rows is not None and self._buffers["qweight"].is_meta:
            return rows()
        q, z = kernels.reference.unpack_int4(self.qweight).t(), kernels.reference.unpack_int4(self.qzeros).t()
        s = self.scales.t()
        return q, z, s, self.mins.t() if self.has_mins else None

    def _released(self) -> None:
        self._prepared = None

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self._prepared = None  # new tensors: repack on next use
        super()._load_from_state_dict(*args, **kwargs)

    def _apply(self, fn: Any, recurse: bool = True) -> Int4Linear:
        self._prepared = None  # moved or cast: repack on next use
        return super()._apply(fn, recurse)

    def forward(self, x: Tensor) -> Tensor:
        if hasattr(kernels, "prepare"):
            if self._prepared is None:
                self._prepared = kernels.prepare(self.qweight, self.qzeros, self.scales, self.group_size,
                                                 self.mins)
            y = self._prepared.matmul(x)
        else:
            y = kernels.int4_linear(x, self.qweight, self.qzeros, self.scales, self.group_size, self.mins)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, group_size={self.group_size}, " \
               f"bias={self.bias is not None}" + (", mins=True" if self.mins is not None else "")


def decoder_linears(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, module) of every projection inside the decoder layers."""
    found = []
    for layer in model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name in LINEAR_NAMES:
                if hasattr(parent, name):
                    found.append((parent, name, getattr(parent, name)))
    return found


def bits_per_weight(model: nn.Module) -> float:
    """Stored bits per weight over the decoder's INT4 linears: the 4-bit integers plus every group's fp16
    scale and packed 4-bit zero point, and fp16 minimum where it has one (the output head and embeddings
    not included)."""
    bits = weights = 0
    for _, _, lin in decoder_linears(model):
        if isinstance(lin, Int4Linear):
            parts = (lin.qweight, lin.qzeros, lin.scales) + (() if lin.mins is None else (lin.mins,))
            bits += sum(t.numel() * t.element_size() * 8 for t in parts)
            weights += lin.in_features * lin.out_features
    return bits / weights if weights else float("nan")
