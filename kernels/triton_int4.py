"""INT4 x fp16/bf16 matmul in Triton, reading the AutoAWQ GEMM layout directly.

Two kernels share one dequantization helper, which loads each packed int32 once, spreads its eight
nibbles over eight columns, subtracts the zero point and applies the scale in registers: no dense weight
ever exists in memory. Both accumulate in fp32.

- `_int4_gemv_kernel`, M <= 16 rows (decode, verification of k+1 speculated tokens). Few rows give few
  output tiles, so the K loop is split across programs (split-K) to fill the GPU at M = 1. Split programs
  add into an fp32 workspace; the last one to finish a tile (counted by an atomic ticket) converts it to
  the output dtype and zeroes the workspace again. That keeps a decode linear at one kernel launch: no
  memset before, no cast after, which matters when a 4096x4096 INT4 weight takes ~2 us to stream.
- `_int4_gemm_kernel`, prefill: one output tile per program, grouped launch order for L2 reuse.

The weights stay in AWQ's layout (qweight [K, N/8] int32); AWQ's interleaved nibble order costs one shift
per element, cheaper than keeping a second copy of the weights.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# PARLEY_TRITON_AUTOTUNE=0 runs the first config only: correctness tests need no tuning, only compiles.
AUTOTUNE = not INTERPRET and os.environ.get("PARLEY_TRITON_AUTOTUNE", "1") != "0"
GEMV_MAX_ROWS = 16  # M above this takes the GEMM kernel

# Chosen by compiling for sm_90 offline and reading register use: each stays under ~140 registers per
# thread without spills, so several programs fit per SM to keep enough loads in flight. Split-K spans
# 1 (wide N) to 32 (N = 576 with long K). The first is the one tests run when tuning is off.
GEMV_CONFIGS = [
    triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sk}, num_warps=w, num_stages=3)
    for bn, bk, sk, w in [
        (128, 64, 4, 4),
        (128, 32, 1, 4),
        (256, 32, 2, 4),
        (128, 32, 8, 4),
        (256, 64, 8, 8),
        (128, 128, 8, 8),
        (128, 64, 16, 4),
        (128, 32, 32, 4),
    ]
]
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


def _gemv_configs() -> list[triton.Config]:
    if INTERPRET:  # one config with big tiles: the interpreter runs every program in Python
        return [triton.Config({"BLOCK_N": 256, "BLOCK_K": 128, "SPLIT_K": 2})]
    return GEMV_CONFIGS if AUTOTUNE else GEMV_CONFIGS[:1]


def _gemm_configs() -> list[triton.Config]:
    if INTERPRET:
        return [triton.Config({"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8})]
    return GEMM_CONFIGS if AUTOTUNE else GEMM_CONFIGS[:1]


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


@triton.autotune(configs=_gemv_configs(), key=["N", "K", "GROUP_SIZE", "BLOCK_M"])
@triton.jit
def _int4_gemv_kernel(x_ptr, qweight_ptr, qzeros_ptr, scales_ptr, out_ptr, workspace_ptr, tickets_ptr,
                      M, N, K, stride_xm,
                      GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, UPCAST: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """out[M, N] = x[M, K] @ W; program (n, s) covers columns tile n over the s-th share of K.

    workspace [GEMV_MAX_ROWS, N] fp32 and tickets [cdiv(N, BLOCK_N)] int32 are zero on entry and on exit.
    """
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid_n * BLOCK_N
    offs_m = tl.arange(0, BLOCK_M)
    n_blocks = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(n_blocks, SPLIT_K)
    first = pid_k * per_split
    last = tl.minimum(first + per_split, n_blocks)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for b in range(first, last):
        k0 = b * BLOCK_K
        offs_k = k0 + tl.arange(0, BLOCK_K)
        w = _dequantize_block(qweight_ptr, qzeros_ptr, scales_ptr, k0, n0, N, K, GROUP_SIZE, BLOCK_K, BLOCK_N)
        x_mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=x_mask, other=0.0)
        if BLOCK_M == 1:
            # One row: multiply and reduce over K on the CUDA cores instead of padding a tensor-core dot.
            xk = tl.reshape(x.to(tl.float32), (BLOCK_K, 1))
            acc += tl.reshape(tl.sum(xk * w, axis=0), (1, BLOCK_N))
        else:
            acc += _dot(x, w, UPCAST)

    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    out_ptrs = out_ptr + offs_m[:, None] * N + offs_n[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        ws_ptrs = workspace_ptr + offs_m[:, None] * N + offs_n[None, :]
        tl.atomic_add(ws_ptrs, acc, mask=mask, sem="relaxed")
        # acq_rel: our adds are visible before the ticket, and the last taker sees everyone's adds.
        ticket = tl.atomic_add(tickets_ptr + pid_n, 1, sem="acq_rel")
        if ticket == SPLIT_K - 1:
            total = tl.load(ws_ptrs, mask=mask, cache_modifier=".cg")  # from L2, where the atomics landed
            tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=mask)
            tl.store(ws_ptrs, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), mask=mask)
            tl.atomic_xchg(tickets_ptr + pid_n, 0)


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
    """The zeroed split-K scratch for N = n on `device`, shared by every weight of that width.

    The GEMV kernel leaves it zeroed, so sharing is safe for kernels queued on one stream. Call this at
    load time (`prepare` does) so that it is never first allocated inside CUDA-graph capture.
    """
    device = torch.device(device)
    key = (device, n)
    if key not in _workspaces:
        workspace = torch.zeros(GEMV_MAX_ROWS, n, dtype=torch.float32, device=device)
        tickets = torch.zeros(triton.cdiv(n, 16), dtype=torch.int32, device=device)  # BLOCK_N >= 16
        _workspaces[key] = (workspace, tickets)
    return _workspaces[key]


def triton_int4_mm(x: Tensor, qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int) -> Tensor:
    """x [M, K] (fp16/bf16) @ AWQ INT4 weight [K, N] -> [M, N] in x's dtype."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"the Triton INT4 kernels take fp16 or bf16 activations, not {x.dtype}")
    M, K = x.shape
    N = scales.shape[1]
    if K % group_size or qweight.shape != (K, N // 8):
        raise ValueError(f"x [{M}, {K}] does not fit qweight {tuple(qweight.shape)} with group {group_size}")
    x = x if x.stride(1) == 1 else x.contiguous()
    upcast = INTERPRET and x.dtype == torch.bfloat16
    out = torch.empty((M, N), device=x.device, dtype=x.dtype)
    if M <= GEMV_MAX_ROWS:
        workspace, tickets = gemv_workspace(x.device, N)
        grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT_K"])
        _int4_gemv_kernel[grid](x, qweight, qzeros, scales, out, workspace, tickets, M, N, K, x.stride(0),
                                GROUP_SIZE=group_size, BLOCK_M=1 if M == 1 else 16, UPCAST=upcast)
    else:
        grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
        _int4_gemm_kernel[grid](x, qweight, qzeros, scales, out, M, N, K, x.stride(0),
                                triton.next_power_of_2(M), GROUP_SIZE=group_size, UPCAST=upcast)
    return out


@torch.library.custom_op("parley::int4_mm", mutates_args=())
def int4_mm(x: Tensor, qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int) -> Tensor:
    """`triton_int4_mm` as an opaque torch op, so `torch.compile(fullgraph=True)` and CUDA graphs take it
    whole instead of tracing into the launcher (autotuning, grid lambdas). The split-K workspace it
    touches is zero before and after, so the op has no visible side effects."""
    return triton_int4_mm(x, qweight, qzeros, scales, group_size)


@int4_mm.register_fake
def _(x: Tensor, qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int) -> Tensor:
    return x.new_empty((x.shape[0], scales.shape[1]))
