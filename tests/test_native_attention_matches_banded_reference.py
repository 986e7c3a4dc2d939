"""The native attention equals a float64 softmax over the stored cache, with or without a sliding window.

Through the library's `parley_attention` entry point (one layer: write the positions' K/V in the cache's stored
form, then attend), at head dims 64, 128 and 256 (Gemma 3 uses 256 with 1 KV head and 4 query heads), every
cache type, and windows that start inside, at and across the 256-key attention blocks. The reference reads
the cache back as stored (dequantized in PyTorch) and applies a banded causal mask: position p sees keys j
with p - window < j <= p. Also pins that a window's result is bitwise the same in any pass split.
"""

from __future__ import annotations

import ctypes
import math
import random

import pytest
import torch

from parley.kernels import native
from parley.models import native_forward
from parley.models.config import ModelConfig
from parley.models.transformer import KV_CACHE_TYPES, KVCache

lib = native_forward.library()
pytestmark = pytest.mark.skipif(lib is None, reason=f"native step unavailable: {native_forward.why_unavailable()}")

MAX_LEN = 640


def native_cache(cache: KVCache) -> native.Cache:
    kvs = (native.KV * cache.n_layers)()
    for i in range(cache.n_layers):
        kvs[i] = native.KV(*[getattr(cache, f"{n}{i}").data_ptr() if hasattr(cache, f"{n}{i}") else None
                             for n in ("k", "v", "ks", "vs", "vm")])
    c = native.Cache(native.KV_KINDS[cache.kind], cache.max_len, kvs)
    c._keep = kvs  # the array must outlive the struct that points at it
    return c


def stored(cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer 0's keys and values [KVH, L, D] as the cache holds them, dequantized in float64."""
    k, v = cache.k0[0], cache.v0[0]
    if cache.kind in ("fp", "bf16"):
        return k.double(), v.double()
    k = k.double() * cache.ks0[0].double()[..., None]
    if cache.kind == "int8":
        return k, v.double() * cache.vs0[0].double()[..., None]
    q = torch.cat([v & 15, v >> 4], dim=-1).double()  # byte j: dim j (low nibble), dim j + D/2 (high)
    g = q.shape[-1] // 32
    s = cache.vs0[0].double().repeat_interleave(32, -1)[..., : g * 32]
    m = cache.vm0[0].double().repeat_interleave(32, -1)[..., : g * 32]
    return k, q * s + m


def banded_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: list[int],
                     window: int) -> torch.Tensor:
    """q [M, H, D], k/v [KVH, L, D] -> [M, H, D]: softmax(q k^T / sqrt(D)) v over keys (p - window, p]."""
    M, H, D = q.shape
    G = H // k.shape[0]
    out = torch.empty(M, H, D, dtype=torch.float64)
    for m, p in enumerate(positions):
        lo = max(0, p - window + 1) if window > 0 else 0
        for h in range(H):
            kk, vv = k[h // G, lo : p + 1], v[h // G, lo : p + 1]
            w = torch.softmax(kk @ q[m, h].double() / math.sqrt(D), dim=0)
            out[m, h] = w @ vv
    return out


def run(cache: KVCache, c: native.Cache, positions: list[int], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        window: int) -> torch.Tensor:
    M, H, D = q.shape
    pos = torch.tensor(positions, dtype=torch.int64)
    out = torch.empty(M, H, D)
    rc = lib.parley_attention(ctypes.byref(c), 0, M, pos.data_ptr(), H, k.shape[1], D, window, q.data_ptr(),
                              k.data_ptr(), v.data_ptr(), out.data_ptr())
    assert rc == 0
    return out


def inputs(seed: int, n: int, H: int, KVH: int, D: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, H, D, generator=g) * 2
    k = torch.randn(n, KVH, D, generator=g) * 2
    v = torch.randn(n, KVH, D, generator=g)
    return q, k, v


def attend_in_passes(kind: str, D: int, H: int, KVH: int, sizes: list[int], window: int, seed: int
                     ) -> tuple[torch.Tensor, KVCache]:
    cfg = ModelConfig(arch="llama", vocab_size=16, dim=H * D, n_layers=1, n_heads=H, n_kv_heads=KVH, head_dim=D,
                      intermediate_size=16, max_seq_len=MAX_LEN)
    cache = KVCache(cfg, MAX_LEN, kind=kind)
    c = native_cache(cache)
    q, k, v = inputs(seed, sum(sizes), H, KVH, D)
    outs, start = [], 0
    for n in sizes:
        sl = slice(start, start + n)
        outs.append(run(cache, c, list(range(start, start + n)), q[sl].contiguous(), k[sl].contiguous(),
                        v[sl].contiguous(), window))
        start += n
    return torch.cat(outs), cache


# (D, query heads, kv heads): SmolLM2's shape, a 128-dim llama, Gemma 3's 256 with 4 query heads on 1 KV head
SHAPES = [(64, 3, 1), (128, 4, 2), (256, 4, 1)]
WINDOWS = [0, 1, 100, 256, 300]
if lib is not None and lib.parley_simd() == 0:
    # The portable loops (tests/test_native_portable_loops.py runs this file against them in a child process that
    # must finish on a busy machine) have one code path for every head dim and window: fewer cases cover it.
    SHAPES, WINDOWS = [SHAPES[0], SHAPES[2]], [0, 100, 300]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("kind", KV_CACHE_TYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"D{s[0]}")
def test_attention_matches_a_banded_float64_softmax(shape: tuple[int, int, int], kind: str, window: int) -> None:
    D, H, KVH = shape
    seed = D + 7 * window + KV_CACHE_TYPES.index(kind)
    n = 600  # three 256-key blocks; windows of 100 and 300 start mid-block, 256 at a block edge
    got, cache = attend_in_passes(kind, D, H, KVH, [n - 40, 40], window, seed)
    k, v = stored(cache)
    positions = list(range(0, n, 7)) + [255, 256, 257, 511, 512, n - 1]
    q = inputs(seed, n, H, KVH, D)[0]
    ref = banded_reference(q[positions], k, v, positions, window)
    err = ((got[positions].double() - ref).norm() / ref.norm()).item()
    tol = {"fp": 1e-5, "bf16": 1e-5}.get(kind, 1e-3)  # int8 keys meet an int16 query, int8 values int16 weights
    assert err < tol, f"seed={seed} D={D} kind={kind} window={window}: relative error {err}"


@pytest.mark.parametrize("kind", KV_CACHE_TYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"D{s[0]}")
def test_windowed_attention_is_the_same_in_any_pass_split(shape: tuple[int, int, int], kind: str) -> None:
    D, H, KVH = shape
    seed = 3 * D + KV_CACHE_TYPES.index(kind)
    rng = random.Random(seed)
    sizes: list[int] = []
    while sum(sizes) < 540:
        sizes.append(min(rng.randint(1, 33), 540 - sum(sizes)))
    whole = attend_in_passes(kind, D, H, KVH, [540], 300, seed)[0]
    split = attend_in_passes(kind, D, H, KVH, sizes, 300, seed)[0]
    assert torch.equal(whole, split), f"seed={seed}: passes of {sizes} differ from one pass"
