"""Decode attention in Triton over a KV cache kept in its stored form: fp, bf16, int8 or K-int8/V-int4.

A decode or verification pass has few query rows (T <= ~16) and a long cache: the cost is reading the
cache, so the quantized layouts are read as they are stored and dequantized in registers, never
materialised in full precision. One program per (query row, kv head, chunk of CHUNK slots) takes the
query heads sharing that kv head as the rows of a tensor-core tile and walks its slots in blocks, in a
fixed order, with an online softmax in fp32; a second kernel merges the chunks in order. A row's result
depends only on that row's query, position and the cache, so it is bitwise the same whatever T the pass
has (batch invariance, which keeps
speculative verification equal to plain decoding). Q.K runs in the query's dtype (int8 keys are exact
in it), P.V in TF32 on the GPU (fp32 under the interpreter).

Cache layouts, per layer, batch 1 (the CPU path stores the same):
- "fp" / "bf16": k, v [KVH, L, D] in that dtype.
- "int8": k int8 [KVH, L, D] and k_scale fp32 [KVH, L] (k = k_int8 * k_scale, symmetric, scale =
  amax/127, round half to even, clamp +-127); v likewise with v_scale.
- "k8v4": k as in "int8"; v uint8 [KVH, L, D/2], byte j holding d = j in its low nibble and
  d = j + D/2 in its high nibble, with v_scale and v_min fp32 [KVH, L, D/32] for groups of 32 along D:
  v = q * scale + min, q in 0..15, scale = (max - min)/15 (scale 0 -> q 0).

`quantize_int8`, `quantize_int4` and `write_kv` are plain torch (CPU or CUDA, no host syncs, so a CUDA
graph can capture them): the verification pass writes its k+1 new positions with them before attending,
exactly as k+1 plain decode steps would.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
KV_KINDS = ("fp", "bf16", "int8", "k8v4")
V_GROUP = 32  # the int4 V cache's group size along D
BLOCK_L, NUM_WARPS = 32, 4  # slots per step; at D = 128 larger blocks spill on sm_90
CHUNK = 256  # slots per program: a 4,096-slot cache gives 16 programs per (row, kv head)


def quantize_int8(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [..., D] -> (int8 [..., D], fp32 scale [...]): symmetric per row, scale = amax/127."""
    x = x.float()
    scale = x.abs().amax(dim=-1) / 127
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(x / safe[..., None]).clamp(-127, 127)  # torch.round: half to even
    return q.to(torch.int8), scale


def quantize_int4(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """x [..., D] -> (uint8 [..., D/2], fp32 scale [..., D/32], fp32 min [..., D/32]), asymmetric per
    group of 32; byte j holds d = j (low nibble) and d = j + D/2 (high nibble)."""
    D = x.shape[-1]
    if D % (2 * V_GROUP):
        raise ValueError(f"the int4 V cache needs a head dim that is a multiple of {2 * V_GROUP}, not {D}")
    groups = x.float().reshape(*x.shape[:-1], D // V_GROUP, V_GROUP)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = (high - low) / 15
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round((groups - low[..., None]) / safe[..., None]).clamp(0, 15)
    q = torch.where(scale[..., None] == 0, torch.zeros_like(q), q).to(torch.uint8).reshape(*x.shape[:-1], D)
    return q[..., : D // 2] | (q[..., D // 2 :] << 4), scale, low


def dequantize_int4(packed: Tensor, scale: Tensor, low: Tensor) -> Tensor:
    """The inverse layout of `quantize_int4`, in fp32 (for references and the CPU path)."""
    q = torch.cat([packed & 0xF, packed >> 4], dim=-1).float()
    D = q.shape[-1]
    q = q.reshape(*q.shape[:-1], D // V_GROUP, V_GROUP)
    return (q * scale[..., None] + low[..., None]).reshape(*packed.shape[:-1], D)


def new_cache(kind: str, kv_heads: int, length: int, head_dim: int, device: torch.device | str,
              dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
    """Empty (zeroed) cache tensors of one layer for `kind`; "fp" stores `dtype`."""
    shape, rows = (kv_heads, length, head_dim), (kv_heads, length)
    if kind in ("fp", "bf16"):
        store = dtype if kind == "fp" else torch.bfloat16
        return {name: torch.zeros(shape, dtype=store, device=device) for name in ("k", "v")}
    cache = {"k": torch.zeros(shape, dtype=torch.int8, device=device),
             "k_scale": torch.zeros(rows, dtype=torch.float32, device=device)}
    if kind == "int8":
        cache.update(v=torch.zeros(shape, dtype=torch.int8, device=device),
                     v_scale=torch.zeros(rows, dtype=torch.float32, device=device))
    elif kind == "k8v4":
        groups = (kv_heads, length, head_dim // V_GROUP)
        cache.update(v=torch.zeros(kv_heads, length, head_dim // 2, dtype=torch.uint8, device=device),
                     v_scale=torch.zeros(groups, dtype=torch.float32, device=device),
                     v_min=torch.zeros(groups, dtype=torch.float32, device=device))
    else:
        raise ValueError(f"KV cache type must be one of {', '.join(KV_KINDS)}, not {kind!r}")
    return cache


def write_kv(kind: str, cache: dict[str, Tensor], k: Tensor, v: Tensor, positions: Tensor) -> None:
    """Store k, v [KVH, T, D] at slots `positions` [T] (a device tensor: no host sync), quantizing."""
    def put(name: str, value: Tensor) -> None:
        cache[name].index_copy_(1, positions, value.to(cache[name].dtype))

    if kind in ("fp", "bf16"):
        put("k", k), put("v", v)
        return
    kq, ks = quantize_int8(k)
    put("k", kq), put("k_scale", ks)
    if kind == "int8":
        vq, vs = quantize_int8(v)
        put("v", vq), put("v_scale", vs)
    else:
        vq, vs, vm = quantize_int4(v)
        put("v", vq), put("v_scale", vs), put("v_min", vm)


def dequantize_cache(kind: str, cache: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """k, v [KVH, L, D] in fp32 from any layout: the reference the kernel is tested against."""
    if kind in ("fp", "bf16"):
        return cache["k"].float(), cache["v"].float()
    k = cache["k"].float() * cache["k_scale"][..., None]
    if kind == "int8":
        return k, cache["v"].float() * cache["v_scale"][..., None]
    return k, dequantize_int4(cache["v"], cache["v_scale"], cache["v_min"])


@triton.jit
def _decode_attention_kernel(q_ptr, pos_ptr, part_ptr, stats_ptr, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr,
                             v_min_ptr, L, sm_scale, SPLITS, H: tl.constexpr, GROUP: tl.constexpr,
                             ROWS: tl.constexpr, D: tl.constexpr, KIND: tl.constexpr, CHUNK: tl.constexpr,
                             BLOCK_L: tl.constexpr, UPCAST: tl.constexpr):
    """Program (t, g, c): the GROUP query heads of row t that share kv head g, against chunk c of the
    slots 0..pos[t] (CHUNK slots each; chunks past pos[t] do nothing).

    The heads are the rows of a [ROWS, D] tile (ROWS >= 16, padding masked), so both products run on
    tensor cores and each slot's K and V are read once per group. KIND: 0 fp/bf16, 1 int8, 2 k8v4.
    Blocks of BLOCK_L slots in increasing order; softmax statistics and accumulators in fp32. Writes the
    chunk's unnormalised output to part [T, H, SPLITS, D] and (max, sum) to stats [T, H, SPLITS, 2].
    """
    t = tl.program_id(0)
    g = tl.program_id(1)
    c = tl.program_id(2)
    pos = tl.load(pos_ptr + t)
    if c * CHUNK > pos:
        return
    head = tl.arange(0, ROWS)
    live_head = head < GROUP
    d = tl.arange(0, D)
    half = tl.arange(0, D // 2)
    q_rows = (t * H + g * GROUP + head) * D
    q = tl.load(q_ptr + q_rows[:, None] + d[None, :], mask=live_head[:, None], other=0.0)
    if UPCAST:  # the CPU interpreter multiplies 16-bit tiles as raw integer bits: do it in fp32
        q = q.to(tl.float32)
    m = tl.full((ROWS,), float("-inf"), tl.float32)
    s_sum = tl.zeros((ROWS,), tl.float32)
    acc = tl.zeros((ROWS, D), tl.float32)
    acc_lo = tl.zeros((ROWS, D // 2), tl.float32)
    acc_hi = tl.zeros((ROWS, D // 2), tl.float32)
    for start in range(c * CHUNK, tl.minimum(pos + 1, (c + 1) * CHUNK), BLOCK_L):
        slots = start + tl.arange(0, BLOCK_L)
        live = slots <= pos
        row = g * L + slots  # index of (kv head, slot) in [KVH, L]
        k = tl.load(k_ptr + row[:, None] * D + d[None, :], mask=live[:, None], other=0).to(q.dtype)
        # (cast: torch.compile's wrapper passes the Python float as fp64, which made the scores and then the
        # second product's operand fp64; on an H200 inductor refused the kernel, "Got fp64 and fp32")
        scores = (tl.dot(q, tl.trans(k)) * sm_scale).to(tl.float32)  # int8 keys: exact in fp16/bf16
        if KIND != 0:  # the per-slot key scale multiplies the score, not every element
            scores = scores * tl.load(k_scale_ptr + row, mask=live, other=0.0)[None, :]
        scores = tl.where(live[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])
        s_sum = s_sum * alpha + tl.sum(p, axis=1)
        if KIND == 2:  # V int4: low nibbles are d < D/2, high nibbles d >= D/2, groups of 32 along D
            packed = tl.load(v_ptr + row[:, None] * (D // 2) + half[None, :], mask=live[:, None], other=0)
            groups = row[:, None] * (D // 32) + half[None, :] // 32
            lo = (packed & 0xF).to(tl.float32) * tl.load(v_scale_ptr + groups, mask=live[:, None], other=0.0) \
                + tl.load(v_min_ptr + groups, mask=live[:, None], other=0.0)
            hi = (packed >> 4).to(tl.float32) * tl.load(v_scale_ptr + groups + D // 64, mask=live[:, None], other=0.0) \
                + tl.load(v_min_ptr + groups + D // 64, mask=live[:, None], other=0.0)
            acc_lo = acc_lo * alpha[:, None] + tl.dot(p, lo, input_precision="tf32")
            acc_hi = acc_hi * alpha[:, None] + tl.dot(p, hi, input_precision="tf32")
        else:
            v = tl.load(v_ptr + row[:, None] * D + d[None, :], mask=live[:, None], other=0).to(tl.float32)
            if KIND == 1:
                p = p * tl.load(v_scale_ptr + row, mask=live, other=0.0)[None, :]
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="tf32")
        m = m_new
    split_row = (t * H + g * GROUP + head) * SPLITS + c  # index into [T, H, SPLITS]
    part = part_ptr + split_row[:, None] * D
    if KIND == 2:
        tl.store(part + half[None, :], acc_lo, mask=live_head[:, None])
        tl.store(part + D // 2 + half[None, :], acc_hi, mask=live_head[:, None])
    else:
        tl.store(part + d[None, :], acc, mask=live_head[:, None])
    tl.store(stats_ptr + split_row * 2, m, mask=live_head)
    tl.store(stats_ptr + split_row * 2 + 1, s_sum, mask=live_head)


@triton.jit
def _combine_kernel(pos_ptr, part_ptr, stats_ptr, out_ptr, SPLITS, H: tl.constexpr, D: tl.constexpr,
                    CHUNK: tl.constexpr):
    """Program (t, h): merge row t's chunk results for head h, chunk 0 first, into out [T, H, D]."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    chunks = tl.load(pos_ptr + t) // CHUNK + 1
    d = tl.arange(0, D)
    base = (t * H + h) * SPLITS
    m = tl.load(stats_ptr + base * 2)
    s_sum = tl.load(stats_ptr + base * 2 + 1)
    acc = tl.load(part_ptr + base * D + d)
    for c in range(1, chunks):
        m_c = tl.load(stats_ptr + (base + c) * 2)
        m_new = tl.maximum(m, m_c)
        a, b = tl.exp(m - m_new), tl.exp(m_c - m_new)
        s_sum = s_sum * a + tl.load(stats_ptr + (base + c) * 2 + 1) * b
        acc = acc * a + tl.load(part_ptr + (base + c) * D + d) * b
        m = m_new
    tl.store(out_ptr + (t * H + h) * D + d, (acc / s_sum).to(out_ptr.dtype.element_ty))


def decode_attention(q: Tensor, kind: str, cache: dict[str, Tensor], positions: Tensor, sm_scale: float,
                     block_l: int = BLOCK_L, chunk: int = CHUNK) -> Tensor:
    """q [T, H, D] over one layer's cache -> [T, H, D] in q's dtype; row t sees slots 0..positions[t].

    `positions` is a device int tensor (no host sync); every slot up to it must already be written.
    Two launches: chunks of `chunk` slots in parallel (enough programs to fill the GPU at T = 1), then
    a merge in chunk order. Chunk boundaries depend only on the slot index, so a row's result is still
    independent of T.
    """
    T, H, D = q.shape
    k = cache["k"]
    kv_heads, L = k.shape[0], k.shape[1]
    if H % kv_heads or D & (D - 1) or D < 64:
        raise ValueError(f"decode_attention needs H a multiple of KVH and D a power of two >= 64; got "
                         f"H={H}, KVH={kv_heads}, D={D}")
    if chunk % block_l:
        raise ValueError(f"chunk ({chunk}) must be a multiple of block_l ({block_l})")
    code = {"fp": 0, "bf16": 0, "int8": 1, "k8v4": 2}[kind]
    dummy = cache.get("k_scale", k)
    group = H // kv_heads
    splits = triton.cdiv(L, chunk)
    part = torch.empty(T, H, splits, D, dtype=torch.float32, device=q.device)
    stats = torch.empty(T, H, splits, 2, dtype=torch.float32, device=q.device)
    positions = positions.to(torch.int32)
    _decode_attention_kernel[(T, kv_heads, splits)](
        q.contiguous(), positions, part, stats, k, cache["v"], dummy, cache.get("v_scale", dummy),
        cache.get("v_min", dummy), L, sm_scale, splits, H=H, GROUP=group,
        ROWS=max(16, triton.next_power_of_2(group)), D=D, KIND=code, CHUNK=chunk, BLOCK_L=block_l,
        UPCAST=INTERPRET and q.dtype != torch.float32, **({} if INTERPRET else {"num_warps": NUM_WARPS}))
    out = torch.empty_like(q)
    _combine_kernel[(T, H)](positions, part, stats, out, splits, H=H, D=D, CHUNK=chunk)
    return out
