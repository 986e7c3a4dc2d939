"""A GGUF's 4-bit blocks as Parley's INT4 linears, without a second quantization.

GGUF's 4-bit formats are all groups of 32 inputs with a scale (and a minimum), which is what an Int4Linear
holds at group size 32:
- Q4_0 (18-byte blocks): w = d (q - 8), d fp16: scale d, integer zero point 8. Exact.
- Q4_1 (20 bytes): w = d q + m, d and m fp16: scale d, zero point 0, minimum m. Exact.
- Q4_K (144-byte super-blocks of 256 = 8 sub-blocks of 32): w = (d sc) q - (dmin mn), d and dmin fp16, sc
  and mn 6-bit integers. The products d sc and dmin mn are exact in fp32 but need up to 17 significant bits;
  Int4Linear stores scales and minimums as fp16 (as every INT4 kernel here reads them), so each is rounded
  to fp16 (a relative error <= 2^-11 per group's scale; `parley bench quality` measures what it costs).
Within a block, q for inputs 0..15 are the low nibbles of bytes 0..15 and 16..31 the high nibbles (Q4_0,
Q4_1); in Q4_K, each 32 bytes hold sub-block 2c in the low nibbles and 2c + 1 in the high ones.

Decoder linears stored in another type (a Q4_K_M file's Q6_K, Q5_0 and Q8_0 tensors) are dequantized and
rounded to INT4 at group 32 (round to nearest, min/max per group: `quantize/pack.py`): one decoder in one
format is what the native CPU step fuses and runs. The embeddings and the output head stay as the
dequantized floats, as for every INT4 model here.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import gguf
import numpy as np
import torch
from torch import Tensor

from ..kernels.reference import AWQ_ORDER
from .quantize.pack import group_params, quantize_int

GROUP = 32  # every GGUF 4-bit format's group of inputs
T = gguf.GGMLQuantizationType
FOUR_BIT = (T.Q4_0, T.Q4_1, T.Q4_K)
WITH_MINS = (T.Q4_1, T.Q4_K)  # a float minimum per group (`mins`)


@dataclass
class Imported:
    """What an import did, by tensor type: which decoder linears run the file's own 4-bit weights and which
    were rounded to INT4 from another type."""

    own: dict[str, int] = field(default_factory=dict)      # type name -> linears imported as stored
    rounded: dict[str, int] = field(default_factory=dict)  # type name -> linears rounded to INT4 (group 32)

    def add(self, kind: gguf.GGMLQuantizationType) -> None:
        target = self.own if kind in FOUR_BIT else self.rounded
        target[kind.name] = target.get(kind.name, 0) + 1

    def words(self) -> str:
        """'Q4_1', or 'Q4_K + Q5_0, Q6_K rounded': the quantization term the engine reports."""
        own = "/".join(sorted(self.own)) or "none"
        return own + (f" + {', '.join(sorted(self.rounded))} rounded" if self.rounded else "")


def q4_groups(kind: gguf.GGMLQuantizationType, data: np.ndarray) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """A 4-bit tensor's raw rows [out, bytes] -> q [out, in] ints 0..15, scales [out, in/32] (fp16 numbers),
    integer zero points [out, in/32] and minimums [out, in/32] (None for Q4_0): W = (q - z) s + m."""
    rows = data.shape[0]
    if kind == T.Q4_0:
        b = data.reshape(rows, -1, 18)
        d = b[..., 0:2].copy().view(np.float16)[..., 0]
        q = _nibbles(b[..., 2:18])
        return q, _t(d), torch.full(d.shape, 8, dtype=torch.int32), None
    if kind == T.Q4_1:
        b = data.reshape(rows, -1, 20)
        d = b[..., 0:2].copy().view(np.float16)[..., 0]
        m = b[..., 2:4].copy().view(np.float16)[..., 0]
        return _nibbles(b[..., 4:20]), _t(d), torch.zeros(d.shape, dtype=torch.int32), _t(m)
    if kind == T.Q4_K:
        b = data.reshape(rows, -1, 144)
        d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        dmin = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        sc, mn = _k4_scales(b[..., 4:16])                                  # [rows, nsb, 8]
        qs = b[..., 16:144].reshape(rows, -1, 4, 32)                        # 4 chunks of 32 bytes
        q = np.stack([qs & 0xF, qs >> 4], axis=3).reshape(rows, -1)         # sub-blocks 2c, 2c + 1
        scales = (d[..., None] * sc).reshape(rows, -1).astype(np.float16)  # fp32-exact, rounded to fp16
        mins = (-(dmin[..., None] * mn)).reshape(rows, -1).astype(np.float16)
        return torch.from_numpy(q), _t(scales), torch.zeros(scales.shape, dtype=torch.int32), _t(mins)
    raise ValueError(f"{kind.name} is not a 4-bit GGUF format ({', '.join(k.name for k in FOUR_BIT)} are)")


def _pack_columns(values: Tensor) -> Tensor:
    """`quantize/pack.py`'s pack_columns (the AWQ order) in uint32 arithmetic: the same words, ~10x sooner on
    a whole model's weights, which a start that quantizes nothing waits for."""
    v = values.numpy().astype(np.uint32).reshape(values.shape[0], -1, 8)
    packed = np.zeros(v.shape[:2], dtype=np.uint32)
    for nibble, column in enumerate(AWQ_ORDER):
        packed |= v[..., column] << np.uint32(4 * nibble)
    return torch.from_numpy(packed.view(np.int32))


def _t(a: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def _nibbles(qs: np.ndarray) -> Tensor:
    """[rows, blocks, 16] bytes -> q [rows, blocks * 32]: low nibbles are inputs 0..15, high ones 16..31.
    In torch, into one output: its threads, and no temporaries (numpy's took 6 s of an 8B start)."""
    with warnings.catch_warnings():  # a read-only file mapping: only read here
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(qs)
    out = torch.empty(*qs.shape[:-1], 32, dtype=torch.uint8)
    torch.bitwise_and(t, 0xF, out=out[..., :16])
    torch.bitwise_right_shift(t, 4, out=out[..., 16:])
    return out.reshape(qs.shape[0], -1)


def _k4_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes of packed 6-bit scales and minimums -> both [.., 8] (llama.cpp's get_scale_min_k4)."""
    s = s.astype(np.uint8)
    sc = np.empty((*s.shape[:-1], 8), dtype=np.float32)
    mn = np.empty_like(sc)
    sc[..., :4] = s[..., 0:4] & 63
    mn[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


def int4_rows(kind: gguf.GGMLQuantizationType, data: np.ndarray, fp: Tensor | None,
              rows: object = None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """One decoder linear's integers row by row, what the native step packs (`Int4Linear.q4_rows`): q uint8
    [out, in], zero points, scales (fp16 numbers) and minimums (None without) [out, in/32].

    4-bit types are unpacked from `data` as stored; any other type is rounded to INT4 from `fp`, its
    dequantized weight [out, in], as `quantize_weight` rounds it. `rows`: a function reordering output rows
    (llama's q/k un-permute), applied to every per-row tensor."""
    reorder = rows if callable(rows) else (lambda t: t)
    if kind not in FOUR_BIT:
        assert fp is not None
        w = reorder(fp)
        scales, zeros = group_params(w, GROUP)
        return quantize_int(w, scales, zeros, GROUP).to(torch.uint8), zeros, scales, None
    q, scales, zeros, mins = (None if t is None else reorder(t) for t in q4_groups(kind, data))
    return q, zeros, scales, mins


def int4_tensors(kind: gguf.GGMLQuantizationType, data: np.ndarray, fp: Tensor | None,
                 rows: object = None) -> dict[str, Tensor]:
    """One decoder linear as Int4Linear's tensors (qweight, qzeros, scales, and mins where it has them):
    `int4_rows`, packed as AutoAWQ packs them."""
    q, zeros, scales, mins = int4_rows(kind, data, fp, rows)
    qweight, qzeros, scales16 = _pack_columns(q.t()), _pack_columns(zeros.t()), scales.t().contiguous().half()
    # mins first: the loader makes the linear one with minimums when its first tensor says so
    out = {} if mins is None else {"mins": mins.t().contiguous().half()}
    return {**out, "qweight": qweight, "qzeros": qzeros, "scales": scales16}
