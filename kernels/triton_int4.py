"""INT4 x fp16/bf16 matmul in Triton, reading the AutoAWQ GEMM layout directly.

Two kernels share one dequantization helper, which unpacks nibbles, subtracts the zero point and applies
the scale in registers, so no dense weight ever exists in memory:

- `_int4_gemv_kernel` for M <= 16 rows (decode, speculative verification of k+1 tokens). Few rows give
  few output tiles, so the K loop is split across programs (split-K) that add their partial sums into an
  fp32 buffer; that is what lets a 4096-wide layer fill a GPU at M = 1.
- `_int4_gemm_kernel` for prefill: classic output tiles with a grouped launch order for L2 reuse.

Both accumulate in fp32. The weights stay in AWQ's layout (qweight [K, N/8] int32, nibbles in AWQ's
interleaved order): the reorder costs one shift per element, which is cheaper than a second weight copy.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
GEMV_MAX_ROWS = 16  # M above this takes the GEMM kernel


def _gemv_configs() -> list[triton.Config]:
    if INTERPRET:  # one config, big tiles: the interpreter runs every program in Python
        return [triton.Config({"BLOCK_N": 256, "BLOCK_K": 128, "SPLIT_K": 2})]
    return [
        triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sk}, num_warps=w, num_stages=s)
        for bn, bk, sk, w, s in [
            (64, 128, 1, 4, 3),
            (128, 64, 2, 4, 3),
            (128, 128, 4, 4, 3),
            (128, 128, 8, 4, 2),
            (256, 64, 4, 8, 3),
            (256, 128, 8, 8, 2),
            (64, 64, 16, 2, 3),
            (128, 64, 16, 4, 2),
        ]
    ]


def _gemm_configs() -> list[triton.Config]:
    if INTERPRET:
        return [triton.Config({"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8})]
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=w, num_stages=s)
        for bm, bn, bk, w, s in [
            (32, 64, 64, 4, 4),
            (64, 64, 64, 4, 4),
            (64, 128, 64, 4, 3),
            (128, 128, 32, 8, 3),
            (128, 128, 64, 8, 3),
            (128, 256, 32, 8, 3),
        ]
    ]


@triton.jit
def _dequantize_block(qweight_ptr, qzeros_ptr, scales_ptr, offs_k, offs_n, k0, N, K,
                      GROUP_SIZE: tl.constexpr, BLOCK_K: tl.constexpr):
    """The [BLOCK_K, BLOCK_N] weight tile at rows offs_k, columns offs_n, as fp32 (zero outside K x N)."""
    words = N // 8
    word = offs_n // 8
    j = offs_n % 8
    shift = ((j // 2) + (j % 2) * 4) * 4  # AWQ stores column j of a word in nibble (0,4,1,5,2,6,3,7)[j]
    mask_n = offs_n < N
    mask = (offs_k[:, None] < K) & mask_n[None, :]
    q = tl.load(qweight_ptr + offs_k[:, None] * words + word[None, :], mask=mask, other=0)
    q = (q >> shift[None, :]) & 0xF
    if BLOCK_K <= GROUP_SIZE:
        # Both are powers of two and k0 is a multiple of BLOCK_K: the whole tile is in one group.
        g = k0 // GROUP_SIZE
        z = tl.load(qzeros_ptr + g * words + word, mask=mask_n, other=0)
        z = ((z >> shift) & 0xF)[None, :]
        s = tl.load(scales_ptr + g * N + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    else:
        g = offs_k // GROUP_SIZE
        z = tl.load(qzeros_ptr + g[:, None] * words + word[None, :], mask=mask, other=0)
        z = (z >> shift[None, :]) & 0xF
        s = tl.load(scales_ptr + g[:, None] * N + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    return (q - z).to(tl.float32) * s


@triton.jit
def _dot(x, w, UPCAST: tl.constexpr):
    """x @ w with w rounded to x's dtype and fp32 accumulation.

    UPCAST does the same arithmetic on fp32 operands: Triton's CPU interpreter multiplies bf16 tiles
    as raw integer bits, so the tests take this branch for bf16; real GPUs never do.
    """
    w = w.to(x.dtype)
    if UPCAST:
        return tl.dot(x.to(tl.float32), w.to(tl.float32))
    return tl.dot(x, w)


@triton.autotune(configs=_gemv_configs(), key=["N", "K", "GROUP_SIZE", "BLOCK_M"], reset_to_zero=["out_ptr"])
@triton.jit
def _int4_gemv_kernel(x_ptr, qweight_ptr, qzeros_ptr, scales_ptr, out_ptr, M, N, K, stride_xm,
                      GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, UPCAST: tl.constexpr):
    """out[M, N] (fp32, zeroed by the caller) += x[M, K] @ W over this program's share of K."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_blocks = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(n_blocks, SPLIT_K)
    first = pid_k * per_split
    last = tl.minimum(first + per_split, n_blocks)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for b in range(first, last):
        k0 = b * BLOCK_K
        offs_k = k0 + tl.arange(0, BLOCK_K)
        w = _dequantize_block(qweight_ptr, qzeros_ptr, scales_ptr, offs_k, offs_n, k0, N, K,
                              GROUP_SIZE, BLOCK_K)
        x_mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=x_mask, other=0.0)
        if BLOCK_M == 1:
            # One row: a multiply and a column reduction on the CUDA cores beats padding a tensor-core dot.
            xk = tl.reshape(x.to(tl.float32), (BLOCK_K, 1))
            acc += tl.reshape(tl.sum(xk * w, axis=0), (1, BLOCK_N))
        else:
            acc += _dot(x, w, UPCAST)
    out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    out_ptrs = out_ptr + offs_m[:, None] * N + offs_n[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc, mask=out_mask)
    else:
        tl.atomic_add(out_ptrs, acc, mask=out_mask)


@triton.autotune(configs=_gemm_configs(), key=["M_BUCKET", "N", "K", "GROUP_SIZE"])
@triton.jit
def _int4_gemm_kernel(x_ptr, qweight_ptr, qzeros_ptr, scales_ptr, out_ptr, M, N, K, stride_xm, M_BUCKET,
                      GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, UPCAST: tl.constexpr):
    """out[M, N] = x[M, K] @ W, one output tile per program. M_BUCKET only keys the autotuner."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    # Grouped order: GROUP_M row-tiles walk the same column-tiles together, so weight tiles stay in L2.
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
        w = _dequantize_block(qweight_ptr, qzeros_ptr, scales_ptr, offs_k, offs_n, k0, N, K,
                              GROUP_SIZE, BLOCK_K)
        acc += _dot(x, w, UPCAST)
    out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_mask)


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
    if M <= GEMV_MAX_ROWS:
        block_m = 1 if M == 1 else 16
        out = torch.zeros((M, N), device=x.device, dtype=torch.float32)
        grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT_K"])
        _int4_gemv_kernel[grid](x, qweight, qzeros, scales, out, M, N, K, x.stride(0),
                                GROUP_SIZE=group_size, BLOCK_M=block_m, UPCAST=upcast)
        return out.to(x.dtype)
    out = torch.empty((M, N), device=x.device, dtype=x.dtype)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)
    _int4_gemm_kernel[grid](x, qweight, qzeros, scales, out, M, N, K, x.stride(0), triton.next_power_of_2(M),
                            GROUP_SIZE=group_size, UPCAST=upcast)
    return out


@torch.library.custom_op("parley::int4_mm", mutates_args=())
def int4_mm(x: Tensor, qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int) -> Tensor:
    """`triton_int4_mm` as an opaque torch op, so `torch.compile(fullgraph=True)` and CUDA graphs take it
    whole instead of tracing into the launcher (autotuning, grid lambdas)."""
    return triton_int4_mm(x, qweight, qzeros, scales, group_size)


@int4_mm.register_fake
def _(x: Tensor, qweight: Tensor, qzeros: Tensor, scales: Tensor, group_size: int) -> Tensor:
    return x.new_empty((x.shape[0], scales.shape[1]))
