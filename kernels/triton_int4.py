"""INT4 x fp16/bf16 matmul in Triton, reading the AutoAWQ GEMM layout directly.

Two kernels, both accumulating in fp32; no dense weight ever exists in memory.

- `_int4_skinny_kernel`, M <= 16 rows (decode, verification of k+1 speculated tokens). Every M in 1..16
  runs the same 16-row tensor-core tile with the same config, so row m's arithmetic is the same whether
  the pass has 1 row or 16: decode and speculative verification agree bit for bit. Few rows give few
  output tiles, so K is split across programs (split-K) to fill the GPU; each split stores its partial
  sums in a workspace and the last one to finish a tile (an atomic ticket) adds them up in split order,
  so the reduction is deterministic and the layer stays one launch. Optional epilogue: SiLU(gate)*up over
  a [gate | up] weight (`triton_int4_silu_mul`, and `kernels.prepare_gate_up`).
- `_int4_gemm_kernel`, prefill: one output tile per program, grouped launch order for L2 reuse.

Dequantisation in the skinny kernel is a bit trick rather than shifts, masks and an int-to-float per
weight: a nibble masked into the low mantissa of the float 2^23 (0x4B000000) *is* the float 2^23 + q*16^p,
so one LOP3 and one FADD (which also takes the zero point off, exactly) give (q - z)*16^p, and the scale
(with 16^-p folded in) is applied once per group to the dot product's result, not per weight. Each of
the eight nibble positions gets its own dot (columns 8c + AWQ's order[p]), so the packed words reach the
dot's operand layout whole and no dequantized weight crosses threads. On sm_90 this is ~6.3 SASS
instructions per weight in the main loop (`parley bench kernels --sass sm_90`); reaching ~3 needs
lop3/prmt half2 dequantisation in inline PTX with weights reordered to the MMA fragment (Marlin's way).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# PARLEY_TRITON_AUTOTUNE=0 runs the first GEMM config only: correctness tests need no tuning, only compiles.
AUTOTUNE = not INTERPRET and os.environ.get("PARLEY_TRITON_AUTOTUNE", "1") != "0"
SKINNY_MAX_ROWS = 16  # M above this takes the GEMM kernel; M <= 16 shares one 16-row tile
GEMV_MAX_ROWS = SKINNY_MAX_ROWS  # the old name, still read by callers
MAX_SPLIT_K = 16

# The skinny kernel's tiles, (BLOCK_N, BLOCK_K, num_warps, num_stages); BLOCK_K is capped at the group
# size. Not autotuned: the config must not depend on timing (or on M), or results would change from run
# to run. BLOCK_N = 256 gives each of the 4 warps 8 columns of every nibble position's dot (narrower
# tiles leave warps computing the same columns). `parley bench kernels --sass sm_90` compiles each.
SKINNY_TILES = [(256, 64, 4, 3), (256, 32, 4, 3)]
SKINNY_GATED_TILES = [(256, 32, 4, 3)]  # two tiles of accumulators: half the K block, or it spills


def skinny_tiles(gated: bool) -> list[tuple[int, int, int, int]]:
    return SKINNY_GATED_TILES if gated else SKINNY_TILES
GEMM_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=w, num_stages=s)
    for bm, bn, bk, w, s in [
        (64, 128, 64, 4, 3),
        (32, 64, 64, 4, 4),
        (64, 64, 64, 4, 4),
        (64, 256, 32, 8, 3),
        (128, 128, 32, 8, 3),
        (128, 128, 64, 8, 3),
        (128, 256, 32, 8, 3),
    ]
]


def _gemm_configs() -> list[triton.Config]:
    if INTERPRET:
        return [triton.Config({"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8})]
    return GEMM_CONFIGS if AUTOTUNE else GEMM_CONFIGS[:1]


@triton.jit
def _nibble_dot(x, words, high_words, zero_words, scale_words, p: tl.constexpr, UPCAST: tl.constexpr):
    """x [16, BLOCK_K] @ (nibble p of every word, dequantized) -> fp32 [16, BLOCK_N/8].

    Nibbles 0-3 are used in place and 4-7 from `high_words` (the words shifted right by 16, once for all
    four): nibble p sits at bit 4*(p % 4). OR-ed into the mantissa of 2^23 (one LOP3: mask and magic),
    the float is 2^23 + q*16^(p%4) exactly, and subtracting the column's 2^23 + z*16^(p%4) (exact too,
    one FADD) leaves (q - z)*16^(p%4): at most 15*4096 in magnitude and four significant bits, so exact
    in fp16 and bf16. The column's scale, divided by 16^(p%4), multiplies the dot's result once per
    column, not each weight.
    """
    mask: tl.constexpr = 0xF << ((p % 4) * 4)
    power: tl.constexpr = 1 << ((p % 4) * 4)
    source = words if p < 4 else high_words
    bits = (source & mask) | 0x4B000000
    z = ((zero_words >> (4 * p)) & 0xF).to(tl.float32)
    w = bits.to(tl.float32, bitcast=True) - (8388608.0 + z * power)[None, :]
    if UPCAST:  # noqa: SIM108 (the CPU interpreter multiplies bf16 tiles as raw integer bits: use fp32)
        d = tl.dot(x.to(tl.float32), w)
    else:
        d = tl.dot(x, w.to(x.dtype))
    return d * (scale_words * (1.0 / power))[None, :]


@triton.jit
def _scale_slice(scales_ptr, g, N, col0, c, valid, p: tl.constexpr):
    """The scales of columns col0 + 8c + AWQ's order[p] (order = 0, 2, 4, 6, 1, 3, 5, 7), fp32."""
    column = col0 + 8 * c + (p % 4) * 2 + p // 4
    return tl.load(scales_ptr + g * N + column, mask=valid, other=0.0).to(tl.float32)


@triton.jit
def _dequant_dot(x, qweight_ptr, qzeros_ptr, scales_ptr, k0, col0, n_valid, N,
                 GROUP_SIZE: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    """x [16, BLOCK_K] @ the INT4 tile at rows k0.., columns col0.. -> 8 fp32 [16, BLOCK_N/8] results,
    one per nibble position p (columns col0 + 8c + AWQ's order[p]).

    One dot per nibble position keeps the packed words whole until they are in the dot's operand layout:
    no dequantized weight crosses threads. BLOCK_K divides the group size: the tile lies in one group.
    """
    g = k0 // GROUP_SIZE
    c = tl.arange(0, BLOCK_N // 8)
    valid = 8 * c < n_valid
    offs_k = k0 + tl.arange(0, BLOCK_K)
    words = tl.load(qweight_ptr + offs_k[:, None] * (N // 8) + (col0 // 8 + c)[None, :], mask=valid[None, :],
                    other=0)
    zero_words = tl.load(qzeros_ptr + g * (N // 8) + col0 // 8 + c, mask=valid, other=0)
    high_words = (words >> 16) & 0xFFFF  # logical: no sign bits to mask off later
    return (_nibble_dot(x, words, high_words, zero_words, _scale_slice(scales_ptr, g, N, col0, c, valid, 0),
                        0, UPCAST),
            _nibble_dot(x, words, high_words, zero_words, _scale_slice(scales_ptr, g, N, col0, c, valid, 1),
                        1, UPCAST),
            _nibble_dot(x, words, high_words, zero_words, _scale_slice(scales_ptr, g, N, col0, c, valid, 2),
                        2, UPCAST),
            _nibble_dot(x, words, high_words, zero_words, _scale_slice(scales_ptr, g, N, col0, c, valid, 3),
                        3, UPCAST),
            _nibble_dot(x, words, high_words, zero_words, _scale_slice(scales_ptr, g, N, col0, c, valid, 4),
                        4, UPCAST),
            _nibble_dot(x, words, high_words, zero_words, _scale_slice(scales_ptr, g, N, col0, c, valid, 5),
                        5, UPCAST),
            _nibble_dot(x, words, high_words, zero_words, _scale_slice(scales_ptr, g, N, col0, c, valid, 6),
                        6, UPCAST),
            _nibble_dot(x, words, high_words, zero_words, _scale_slice(scales_ptr, g, N, col0, c, valid, 7),
                        7, UPCAST))


@triton.jit
def _add8(a, b):
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4], a[5] + b[5], a[6] + b[6], a[7] + b[7])


@triton.jit
def _int4_skinny_kernel(x_ptr, qweight_ptr, qzeros_ptr, scales_ptr, out_ptr, workspace_ptr, tickets_ptr,
                        M, N, K, stride_xm, SPLIT_K,
                        GROUP_SIZE: tl.constexpr, GATED: tl.constexpr, UPCAST: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[M, N_OUT] = x[M, K] @ W (or SiLU(x @ W_gate) * (x @ W_up) when GATED, W = [gate | up]).

    Program (n, s) covers output tile n over the s-th share of K. workspace [SPLIT_K, 16, N] fp32 holds
    the partial sums; tickets [>= tiles] int32 are zero on entry and on exit.
    """
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n_out = N // 2 if GATED else N
    n0 = pid_n * BLOCK_N
    n_valid = n_out - n0
    rows = tl.arange(0, 16)
    n_blocks = K // BLOCK_K
    per_split = tl.cdiv(n_blocks, SPLIT_K)
    first = pid_k * per_split
    last = tl.minimum(first + per_split, n_blocks)
    zero = tl.zeros((16, BLOCK_N // 8), dtype=tl.float32)
    acc = (zero, zero, zero, zero, zero, zero, zero, zero)
    acc_up = (zero, zero, zero, zero, zero, zero, zero, zero)
    for b in range(first, last):
        k0 = b * BLOCK_K
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + offs_k[None, :], mask=rows[:, None] < M, other=0.0)
        acc = _add8(acc, _dequant_dot(x, qweight_ptr, qzeros_ptr, scales_ptr, k0, n0, n_valid, N,
                                      GROUP_SIZE, BLOCK_K, BLOCK_N, UPCAST))
        if GATED:
            acc_up = _add8(acc_up, _dequant_dot(x, qweight_ptr, qzeros_ptr, scales_ptr, k0, n_out + n0, n_valid, N,
                                                GROUP_SIZE, BLOCK_K, BLOCK_N, UPCAST))

    c = tl.arange(0, BLOCK_N // 8)
    mask = (rows[:, None] < M) & (8 * c[None, :] < n_valid)
    if SPLIT_K > 1:
        # Deterministic split-K: store this split's partials, take a ticket; the last taker adds all
        # partials in split order (never in arrival order), writes the output and resets the ticket.
        ws = workspace_ptr + rows[:, None] * N + n0 + 8 * c[None, :]
        _store8(ws + pid_k * 16 * N, acc, mask)
        if GATED:
            _store8(ws + pid_k * 16 * N + n_out, acc_up, mask)
        tl.debug_barrier()
        ticket = tl.atomic_add(tickets_ptr + pid_n, 1, sem="acq_rel")
        if ticket == SPLIT_K - 1:
            acc = (zero, zero, zero, zero, zero, zero, zero, zero)
            acc_up = (zero, zero, zero, zero, zero, zero, zero, zero)
            for s in range(SPLIT_K):
                acc = _add8(acc, _load8(ws + s * 16 * N, mask))
                if GATED:
                    acc_up = _add8(acc_up, _load8(ws + s * 16 * N + n_out, mask))
            _epilogue8(out_ptr + rows[:, None] * n_out + n0 + 8 * c[None, :], acc, acc_up, mask, GATED)
            tl.atomic_xchg(tickets_ptr + pid_n, 0)
    else:
        _epilogue8(out_ptr + rows[:, None] * n_out + n0 + 8 * c[None, :], acc, acc_up, mask, GATED)


@triton.jit
def _store8(ptrs, acc, mask):
    """Store nibble position p's results at column offset AWQ's order[p] of each 8-column block."""
    for p in tl.static_range(8):
        tl.store(ptrs + (p % 4) * 2 + p // 4, acc[p], mask=mask)


@triton.jit
def _load8(ptrs, mask):
    return (tl.load(ptrs + 0, mask=mask, other=0.0, cache_modifier=".cg"),
            tl.load(ptrs + 2, mask=mask, other=0.0, cache_modifier=".cg"),
            tl.load(ptrs + 4, mask=mask, other=0.0, cache_modifier=".cg"),
            tl.load(ptrs + 6, mask=mask, other=0.0, cache_modifier=".cg"),
            tl.load(ptrs + 1, mask=mask, other=0.0, cache_modifier=".cg"),
            tl.load(ptrs + 3, mask=mask, other=0.0, cache_modifier=".cg"),
            tl.load(ptrs + 5, mask=mask, other=0.0, cache_modifier=".cg"),
            tl.load(ptrs + 7, mask=mask, other=0.0, cache_modifier=".cg"))


@triton.jit
def _epilogue8(ptrs, acc, acc_up, mask, GATED: tl.constexpr):
    for p in tl.static_range(8):
        y = acc[p]
        if GATED:
            y = y / (1.0 + tl.exp(-y)) * acc_up[p]  # SiLU(gate) * up, in fp32
        tl.store(ptrs + (p % 4) * 2 + p // 4, y.to(ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _unpack(words, BLOCK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """int32 [rows, BLOCK_N/8] -> nibbles [rows, BLOCK_N] in column order.

    AWQ keeps column j of a word in nibble (0, 4, 1, 5, 2, 6, 3, 7)[j].
    """
    j = tl.arange(0, 8)
    shift = ((j // 2) + (j % 2) * 4) * 4
    q = (words[:, :, None] >> shift[None, None, :]) & 0xF
    return tl.reshape(q, (BLOCK_ROWS, BLOCK_N))


@triton.jit
def _dequantize_block(qweight_ptr, qzeros_ptr, scales_ptr, k0, n0, N, K,
                      GROUP_SIZE: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """The fp32 [BLOCK_K, BLOCK_N] weight tile at rows k0.., columns n0.. (zero outside K x N)."""
    words = N // 8
    offs_k = k0 + tl.arange(0, BLOCK_K)
    offs_w = n0 // 8 + tl.arange(0, BLOCK_N // 8)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask_w = offs_w < words
    mask = (offs_k[:, None] < K) & mask_w[None, :]
    q = _unpack(tl.load(qweight_ptr + offs_k[:, None] * words + offs_w[None, :], mask=mask, other=0),
                BLOCK_K, BLOCK_N)
    if BLOCK_K <= GROUP_SIZE:
        # Both are powers of two and k0 is a multiple of BLOCK_K: the whole tile is in one group.
        g = k0 // GROUP_SIZE
        z = _unpack(tl.load(qzeros_ptr + g * words + offs_w, mask=mask_w, other=0)[None, :], 1, BLOCK_N)
        s = tl.load(scales_ptr + g * N + offs_n, mask=offs_n < N, other=0.0)[None, :]
    else:
        g = offs_k // GROUP_SIZE
        z = _unpack(tl.load(qzeros_ptr + g[:, None] * words + offs_w[None, :], mask=mask, other=0),
                    BLOCK_K, BLOCK_N)
        s_mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
        s = tl.load(scales_ptr + g[:, None] * N + offs_n[None, :], mask=s_mask, other=0.0)
    return (q - z).to(tl.float32) * s.to(tl.float32)


@triton.jit
def _dot(x, w, UPCAST: tl.constexpr):
    """x @ w with w rounded to x's dtype and fp32 accumulation.

    UPCAST does the same arithmetic on fp32 operands: Triton's CPU interpreter multiplies bf16 tiles
    as raw integer bits, so the interpreted tests take this branch for bf16; GPUs never do.
    """
    w = w.to(x.dtype)
    if UPCAST:
        return tl.dot(x.to(tl.float32), w.to(tl.float32))
    return tl.dot(x, w)


@triton.autotune(configs=_gemm_configs(), key=["M_BUCKET", "N", "K", "GROUP_SIZE"])
@triton.jit
def _int4_gemm_kernel(x_ptr, qweight_ptr, qzeros_ptr, scales_ptr, out_ptr, M, N, K, stride_xm, M_BUCKET,
                      GROUP_SIZE: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """out[M, N] = x[M, K] @ W, one output tile per program. M_BUCKET only keys the autotuner."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    # Grouped order: GROUP_M row tiles walk the same column tiles together, so weight tiles stay in L2.
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x_mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=x_mask, other=0.0)
        w = _dequantize_block(qweight_ptr, qzeros_ptr, scales_ptr, k0, pid_n * BLOCK_N, N, K,
                              GROUP_SIZE, BLOCK_K, BLOCK_N)
        acc += _dot(x, w, UPCAST)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)




_workspaces: dict[tuple[torch.device, int], tuple[Tensor, Tensor]] = {}


def gemv_workspace(device: torch.device | str, n: int) -> tuple[Tensor, Tensor]:
    """The split-K scratch for a weight N = n wide on `device`, shared by every weight of that width:
    partial sums [MAX_SPLIT_K, 16, n] fp32 (overwritten, never read before written) and the tickets
    (zero before and after every launch). Call this at load time (`prepare` does) so that it is never
    first allocated inside CUDA-graph capture. Kernels queued on one stream share it safely.
    """
    device = torch.device(device)
    key = (device, n)
    if key not in _workspaces:
        workspace = torch.empty(MAX_SPLIT_K, SKINNY_MAX_ROWS, n, dtype=torch.float32, device=device)
        tickets = torch.zeros(triton.cdiv(n, 16), dtype=torch.int32, device=device)  # BLOCK_N >= 16
        _workspaces[key] = (workspace, tickets)
    return _workspaces[key]


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # the interpreter: pretend an H100/H200, so CPU tests take the GPU's split choices


def skinny_config(n_out: int, K: int, group_size: int, device: torch.device | str, gated: bool = False) -> dict:
    """The skinny kernel's tile and split-K for a shape: a function of the shape and GPU only (never of
    M or of timing), so every M <= 16 runs the same arithmetic. Splits K until there are ~2 programs
    per SM (or each split has one K block)."""
    sms = _sm_count(torch.device(device))
    block_n, block_k, warps, stages = next(t for t in skinny_tiles(gated) if t[1] <= group_size)
    tiles = triton.cdiv(n_out, block_n)
    blocks = K // block_k
    split = 1
    while split * 2 <= min(MAX_SPLIT_K, blocks) and tiles * split * 2 <= 2 * sms:
        split *= 2
    return {"BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_K": split, "num_warps": warps, "num_stages": stages}


def _launch_skinny(x: Tensor, qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int, gated: bool,
                   config: dict | None = None) -> Tensor:
    M, K = x.shape
    N = scales.shape[1]
    n_out = N // 2 if gated else N
    config = dict(config or skinny_config(n_out, K, group_size, x.device, gated))
    split = config.pop("SPLIT_K")
    if INTERPRET:
        config.pop("num_warps", None), config.pop("num_stages", None)
    out = torch.empty((M, n_out), device=x.device, dtype=x.dtype)
    workspace, tickets = gemv_workspace(x.device, N)
    grid = (triton.cdiv(n_out, config["BLOCK_N"]), split)
    _int4_skinny_kernel[grid](x, qweight, qzeros, scales, out, workspace, tickets, M, N, K, x.stride(0), split,
                              GROUP_SIZE=group_size, GATED=gated, UPCAST=INTERPRET and x.dtype == torch.bfloat16,
                              **config)
    return out


def _check(x: Tensor, qweight: Tensor, scales: Tensor, group_size: int) -> None:
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"the Triton INT4 kernels take fp16 or bf16 activations, not {x.dtype}")
    M, K = x.shape
    N = scales.shape[1]
    if K % group_size or group_size % 32 or qweight.shape != (K, N // 8):
        raise ValueError(f"x [{M}, {K}] does not fit qweight {tuple(qweight.shape)} with group {group_size}")


def triton_int4_mm(x: Tensor, qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int) -> Tensor:
    """x [M, K] (fp16/bf16) @ AWQ INT4 weight [K, N] -> [M, N] in x's dtype."""
    _check(x, qweight, scales, group_size)
    x = x if x.stride(1) == 1 else x.contiguous()
    M, K = x.shape
    N = scales.shape[1]
    if M <= SKINNY_MAX_ROWS:
        return _launch_skinny(x, qweight, qzeros, scales, group_size, gated=False)
    out = torch.empty((M, N), device=x.device, dtype=x.dtype)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
    _int4_gemm_kernel[grid](x, qweight, qzeros, scales, out, M, N, K, x.stride(0),
                            triton.next_power_of_2(M), GROUP_SIZE=group_size,
                            UPCAST=INTERPRET and x.dtype == torch.bfloat16)
    return out


def triton_int4_silu_mul(x: Tensor, qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int) -> Tensor:
    """SiLU(x @ W_gate) * (x @ W_up) for W = [gate | up] fused along N (`fuse_columns`): [M, N/2].

    M <= 16 runs it in the skinny kernel's epilogue (one launch, the intermediate never stored); longer
    passes multiply in the GEMM and apply the epilogue in torch.
    """
    _check(x, qweight, scales, group_size)
    x = x if x.stride(1) == 1 else x.contiguous()
    if scales.shape[1] % 16:
        raise ValueError(f"a fused gate/up weight needs N/2 a multiple of 8, not N = {scales.shape[1]}")
    if x.shape[0] <= SKINNY_MAX_ROWS:
        return _launch_skinny(x, qweight, qzeros, scales, group_size, gated=True)
    gate, up = triton_int4_mm(x, qweight, qzeros, scales, group_size).float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)


@torch.library.custom_op("parley::int4_mm", mutates_args=())
def int4_mm(x: Tensor, qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int) -> Tensor:
    """`triton_int4_mm` as an opaque torch op, so `torch.compile(fullgraph=True)` and CUDA graphs take it
    whole instead of tracing into the launcher. The split-K tickets it touches are zero before and after
    and the partials are written before they are read, so the op has no visible side effects."""
    return triton_int4_mm(x, qweight, qzeros, scales, group_size)


@int4_mm.register_fake
def _(x: Tensor, qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int) -> Tensor:
    return x.new_empty((x.shape[0], scales.shape[1]))


@torch.library.custom_op("parley::int4_silu_mul", mutates_args=())
def int4_silu_mul(x: Tensor, qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int) -> Tensor:
    """`triton_int4_silu_mul` as an opaque torch op (see `int4_mm`)."""
    return triton_int4_silu_mul(x, qweight, qzeros, scales, group_size)


@int4_silu_mul.register_fake
def _(x: Tensor, qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int) -> Tensor:
    return x.new_empty((x.shape[0], scales.shape[1] // 2))
