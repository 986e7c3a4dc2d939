"""A decoder-only transformer for the llama, mistral, qwen2, qwen3 and gemma3 families, in plain PyTorch.

The families differ by a few switches of `ModelConfig` (gpt-fast's ModelArgs spirit; which family sets which is
in families.py): Gemma 3 adds norms after attention and the MLP, GeGLU, scaled embeddings, and sliding-window
layers with their own rope base.

One `forward` serves prefill, one-token decode and the verification of k+1 speculated tokens: it takes
token ids and their absolute positions, writes their keys/values into a preallocated cache and attends
over everything the cache holds up to each position. Parameter names follow Hugging Face checkpoints
(minus the leading `model.`), so loading is a name-for-name copy.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig

KV_CACHE_TYPES = ("fp", "bf16", "int8", "k8v4")
USE_TRITON_ATTENTION = os.environ.get("PARLEY_TRITON_ATTENTION", "1") != "0"


def quantize_int8(x: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8 per vector (last dim): x ~ q * scale. The native step rounds the same way."""
    scale = x.float().abs().amax(-1) / 127
    inv = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
    return torch.round(x.float() * inv[..., None]).clamp(-127, 127).to(torch.int8), scale


def quantize_int4_groups(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Asymmetric int4 in groups of 32 along the last dim: x ~ q * scale + min, two values per byte
    (byte j holds element j low and element j + D/2 high)."""
    D = x.shape[-1]
    g = x.float().reshape(*x.shape[:-1], D // 32, 32)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = (hi - lo) / 15
    inv = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
    q = torch.round((g - lo[..., None]) * inv[..., None]).clamp(0, 15).to(torch.uint8).reshape(x.shape)
    return q[..., : D // 2] | (q[..., D // 2 :] << 4), scale, lo


def dequantize_int4_groups(packed: Tensor, scale: Tensor, lo: Tensor) -> Tensor:
    q = torch.cat((packed & 15, packed >> 4), dim=-1).float()
    g = q.reshape(*q.shape[:-1], -1, 32)
    return (g * scale[..., None] + lo[..., None]).reshape(q.shape)


class KVCache(nn.Module):
    """Keys and values of every layer in static buffers, per layer [batch, kv_heads, max_len, head_dim].

    Slot i holds position i. Truncating is setting `length`: stale slots beyond it are hidden by the
    causal mask (a query at position p sees slots <= p) and overwritten by the next tokens, so rolling
    back rejected speculative tokens costs nothing, scales included (they live in the same slots).

    `kind` is the storage: "fp" (the model's dtype), "bf16", "int8" (K and V symmetric int8 with one scale
    per position and head) or "k8v4" (K int8 as before; V int4 in groups of 32 with a scale and a minimum).
    Keys feed the softmax, where errors are exponentiated, so they keep 8 bits; values are averaged.
    A position is written in its stored form before anything attends to it, so every pass (decode,
    verification, prefill) reads exactly the same quantized keys and values.
    """

    def __init__(self, config: ModelConfig, max_len: int, batch: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", kind: str = "fp") -> None:
        super().__init__()
        if kind not in KV_CACHE_TYPES:
            raise ValueError(f"--kv-cache {kind!r}: expected one of {', '.join(KV_CACHE_TYPES)}")
        if kind == "k8v4" and config.head_dim % 32:
            raise ValueError(f"--kv-cache k8v4 needs a head_dim divisible by 32, not {config.head_dim}")
        B, H, L, D = batch, config.n_kv_heads, max_len, config.head_dim
        self.kind, self.dtype, self.n_layers, self.max_len = kind, dtype, config.n_layers, max_len

        def buf(name: str, shape: tuple[int, ...], dt: torch.dtype) -> None:
            self.register_buffer(name, torch.zeros(shape, dtype=dt, device=device), persistent=False)

        for i in range(config.n_layers):
            if kind in ("fp", "bf16"):
                dt = dtype if kind == "fp" else torch.bfloat16
                buf(f"k{i}", (B, H, L, D), dt)
                buf(f"v{i}", (B, H, L, D), dt)
                continue
            buf(f"k{i}", (B, H, L, D), torch.int8)
            buf(f"ks{i}", (B, H, L), torch.float32)
            if kind == "int8":
                buf(f"v{i}", (B, H, L, D), torch.int8)
                buf(f"vs{i}", (B, H, L), torch.float32)
            else:
                buf(f"v{i}", (B, H, L, D // 2), torch.uint8)
                buf(f"vs{i}", (B, H, L, D // 32), torch.float32)
                buf(f"vm{i}", (B, H, L, D // 32), torch.float32)
        self.length = 0  # leading slots holding valid positions; kept by the caller, which knows them
        # How many slots attention reads; set by the caller per forward so shapes stay few (bucketed).
        self.window = max_len

    def bytes_per_position(self) -> int:
        """Bytes one position occupies in all layers (what attention reads per cached token)."""
        total = sum(getattr(self, f"{n}{0}").element_size() * getattr(self, f"{n}{0}")[0, :, 0].numel()
                    for n in ("k", "v", "ks", "vs", "vm") if hasattr(self, f"{n}0"))
        return total * self.n_layers

    def layer_tensors(self, layer: int) -> dict[str, Tensor]:
        """One layer's buffers as [KVH, L, ...] views, named as kernels/triton_attention.py names them."""
        names = {"k": "k", "v": "v", "ks": "k_scale", "vs": "v_scale", "vm": "v_min"}
        return {new: getattr(self, f"{old}{layer}")[0] for old, new in names.items() if hasattr(self, f"{old}{layer}")}

    def copy_positions(self, other: KVCache, start: int, end: int) -> None:
        """Take `other`'s stored keys and values (scales included) of positions [start, end), every layer."""
        if (other.kind, other.max_len, other.n_layers) != (self.kind, self.max_len, self.n_layers):
            raise ValueError(f"cannot copy positions from a {other.kind} cache of {other.max_len} slots into a "
                             f"{self.kind} cache of {self.max_len}")
        for name, buf in self.named_buffers():
            buf[:, :, start:end] = getattr(other, name)[:, :, start:end]

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.max_len:
            raise ValueError(f"cannot truncate a cache of {self.max_len} slots to {length}")
        self.length = length

    def update(self, layer: int, pos: Tensor, k: Tensor, v: Tensor, window: int) -> tuple[Tensor, Tensor]:
        """Write k/v [B, H, T, D] at slots `pos` [T]; return this layer's first `window` slots as k's dtype
        (the PyTorch path dequantizes; the native step reads the stored form directly)."""
        kc, vc = getattr(self, f"k{layer}"), getattr(self, f"v{layer}")
        if self.kind in ("fp", "bf16"):
            kc.index_copy_(2, pos, k.to(kc.dtype))
            vc.index_copy_(2, pos, v.to(vc.dtype))
            return kc[:, :, :window].to(k.dtype), vc[:, :, :window].to(v.dtype)
        kq, ks = quantize_int8(k)
        kc.index_copy_(2, pos, kq)
        getattr(self, f"ks{layer}").index_copy_(2, pos, ks)
        k_out = kc[:, :, :window].float() * getattr(self, f"ks{layer}")[:, :, :window, None]
        if self.kind == "int8":
            vq, vs = quantize_int8(v)
            vc.index_copy_(2, pos, vq)
            getattr(self, f"vs{layer}").index_copy_(2, pos, vs)
            v_out = vc[:, :, :window].float() * getattr(self, f"vs{layer}")[:, :, :window, None]
        else:
            vq, vs, vm = quantize_int4_groups(v)
            vc.index_copy_(2, pos, vq)
            getattr(self, f"vs{layer}").index_copy_(2, pos, vs)
            getattr(self, f"vm{layer}").index_copy_(2, pos, vm)
            v_out = dequantize_int4_groups(vc[:, :, :window], getattr(self, f"vs{layer}")[:, :, :window],
                                           getattr(self, f"vm{layer}")[:, :, :window])
        return k_out.to(k.dtype), v_out.to(v.dtype)

    @property
    def k(self) -> Tensor:
        """All layers' keys stacked [layers, B, H, max_len, D], dequantized (a copy, for inspection and tests)."""
        return torch.stack([self._read(i, "k") for i in range(self.n_layers)])

    @property
    def v(self) -> Tensor:
        return torch.stack([self._read(i, "v") for i in range(self.n_layers)])

    def _read(self, layer: int, which: str) -> Tensor:
        t = getattr(self, f"{which}{layer}")
        if self.kind in ("fp", "bf16"):
            return t.float()
        if which == "k" or self.kind == "int8":
            return t.float() * getattr(self, f"{which}s{layer}")[..., None]
        return dequantize_int4_groups(t, getattr(self, f"vs{layer}"), getattr(self, f"vm{layer}"))


class SequenceCache:
    """Stands in for the KV cache while the model runs on whole sequences (calibration, distillation):
    attention reads the keys and values of this call only, over a window of the sequence's length."""

    def __init__(self, window: int = 0) -> None:
        self.window = window

    def update(self, layer: int, pos: Tensor, k: Tensor, v: Tensor, *_window: int) -> tuple[Tensor, Tensor]:
        return k, v


class Span(NamedTuple):
    """One sequence's rows in a shared pass (`Transformer.forward_spans`): rows `rows` of the pass, at `positions`
    [T], writing their K/V into `cache`; each row attends the keys up to its own position."""

    rows: slice
    positions: Tensor
    cache: KVCache


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in fp32 whatever the activation dtype, as the reference implementations do.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def is_norm_weight(name: str) -> bool:
    """Whether a parameter is an RMSNorm's gain (those a `norm_unit_offset` checkpoint stores as gain - 1)."""
    return name.endswith(("norm.weight", "layernorm.weight"))


def rope_frequencies(config: ModelConfig, local: bool = False) -> Tensor:
    """Inverse frequencies per rotary pair, with llama3-style or linear scaling when configured.

    `local`: those of sliding-window layers (Gemma 3: their own base, never scaled)."""
    d = config.head_dim
    theta = config.rope_local_theta if local else config.rope_theta
    # computed on the CPU whatever the default device (on "meta" the op would import torch._dynamo: 1.4 s)
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64, device="cpu") / d))
    scaling = {} if local else config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        # Long wavelengths are slowed by `factor`, short ones kept, and the band between interpolated.
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        inv_freq = torch.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    elif kind not in ("default", None):
        raise ValueError(f"rope scaling {kind!r} is not supported (default, linear, llama3 are)")
    return inv_freq.float().to(torch.get_default_device())


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate halves ([x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin]), the Hugging Face layout."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        c = config
        self.layer, self.n_heads, self.n_kv_heads, self.head_dim = layer, c.n_heads, c.n_kv_heads, c.head_dim
        self.scale = c.query_scale or c.head_dim ** -0.5
        self.window = c.layer_windows[layer]  # 0: attends to every earlier position
        self.q_proj = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=False)
        if c.qk_norm:  # qwen3 and gemma3 normalise each head's q and k before rotation
            self.q_norm = RMSNorm(c.head_dim, c.norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, pos: Tensor | None,
                cache: KVCache | list[Span]) -> Tensor:
        """`cache` a list of spans: a shared pass, each span attending its own cache (rows past the last span are
        padding: their attention output is zero)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if isinstance(cache, list):
            ys = [self._attend_rows(q[:, :, s.rows], k[:, :, s.rows], v[:, :, s.rows], s.positions, s.cache)
                  for s in cache]
            pad = T - sum(y.shape[1] for y in ys)
            y = torch.cat([*ys, x.new_zeros(B, pad, self.n_heads * self.head_dim)], dim=1)
        else:
            y = self._attend(q, k, v, mask, pos, cache)
        return self.o_proj(y)

    def _triton(self, q: Tensor) -> bool:
        return q.is_cuda and q.shape[2] <= 16 and q.shape[0] == 1 and USE_TRITON_ATTENTION and not self.window

    def _attend_rows(self, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, cache: KVCache) -> Tensor:
        """`_attend` for one sequence's rows of a shared pass, each row on its own: a row's output then does not
        depend on how many rows of its sequence the pass holds, nor on where the pass ends. (One product over T
        query rows, or over a bucketed window under a mask, changes its last bits with T and with the window: the
        same prompt read in different pieces would hold different K/V.) The Triton kernel works this way already."""
        if self._triton(q):
            return self._attend(q, k, v, None, pos, cache)
        B, _, T, _ = q.shape
        keys, values = cache.update(self.layer, pos, k, v, int(pos.max()) + 1)
        ys = []
        for i, p in enumerate(pos.tolist()):
            lo = max(0, p + 1 - self.window) if self.window else 0  # keys p - window < j <= p
            ys.append(F.scaled_dot_product_attention(q[:, :, i : i + 1], keys[:, :, lo : p + 1],
                                                     values[:, :, lo : p + 1], scale=self.scale,
                                                     enable_gqa=self.n_heads != self.n_kv_heads))
        return torch.cat(ys, dim=2).transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, pos: Tensor, cache: KVCache) -> Tensor:
        """Write k/v [B, KVH, T, D] at `pos` and attend: [B, T, H * D]."""
        B, _, T, _ = q.shape
        if self._triton(q):
            # Decode and verification on CUDA: the Triton kernel reads the cache in its stored form, each
            # row up to its own position (no mask), in a fixed order: batch invariant, graph-capturable.
            from ..kernels.triton_attention import decode_attention, write_kv

            layer = cache.layer_tensors(self.layer)
            write_kv(cache.kind, layer, k[0], v[0], pos)
            y = decode_attention(q[0].transpose(0, 1), cache.kind, layer, pos, self.scale)
            return y.reshape(B, T, self.n_heads * self.head_dim)
        assert mask is not None
        k, v = cache.update(self.layer, pos, k, v, mask.shape[-1])
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale,
                                           enable_gqa=self.n_heads != self.n_kv_heads)
        return y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)


def block_hadamard(x: Tensor, h: Tensor, matmul: bool = False) -> Tensor:
    """x [..., n] times the block-diagonal matrix whose blocks are h [b, b], Sylvester's +-1 matrix of order
    b = 2^k (b divides n). By default the fast Walsh-Hadamard transform, butterflies in the order the native
    step's `hadamard_row` (kernels/cpu/rows.h) runs them, so both paths round alike; `matmul` (the GPU path, where
    each butterfly stage would be three tiny kernels) one product by h instead."""
    b = h.shape[0]
    if matmul:
        return (x.reshape(-1, b) @ h.to(x.dtype)).reshape(x.shape)
    shape, half = x.shape, 1
    while half < b:  # pairs (j, j + half) within each run of 2 half channels; runs tile the blocks
        x = x.reshape(-1, 2, half)
        x = torch.stack((x[:, 0] + x[:, 1], x[:, 0] - x[:, 1]), dim=1)
        half *= 2
    return x.reshape(shape)


class MLP(nn.Module):
    """SwiGLU (GeGLU for Gemma). With `down_diag` set (an INT4 model whose down_proj was quantized on rotated
    inputs: models/quantize/hadamard.py), the product is multiplied by diag(down_diag) and the block-diagonal
    Hadamard matrix of blocks `down_hadamard` before down_proj: an orthogonal change of basis that spreads its
    outlier channels."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.dim, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.dim, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.dim, bias=False)
        self.gelu = config.mlp_act == "gelu_tanh"  # GeGLU (Gemma) instead of SwiGLU
        self.register_buffer("down_diag", None, persistent=False)  # [intermediate]: +-1/sqrt(block)
        self.register_buffer("down_hadamard", None, persistent=False)  # [block, block]: Sylvester's +-1

    def forward(self, x: Tensor) -> Tensor:
        gate = self.gate_proj(x)
        gate = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        h = gate * self.up_proj(x)
        if self.down_diag is not None:
            # one product by the matrix on a GPU (each butterfly stage would be three tiny kernels) and when
            # differentiating (models/quantize/distill.py: eight stages cost more to go back through)
            h = block_hadamard(h * self.down_diag.to(h.dtype), self.down_hadamard, matmul=h.is_cuda or h.requires_grad)
        return self.down_proj(h)


class Block(nn.Module):
    """Attention then MLP, each on a normed input and added to the residual.

    Names follow each family's checkpoints: in llama's, `post_attention_layernorm` is the norm *before* the
    MLP; Gemma 3 ("sandwich" norms) calls that one `pre_feedforward_layernorm` and also norms each output
    (`post_attention_layernorm`, `post_feedforward_layernorm`) before adding it. `mlp_norm` is the one
    feeding the MLP, whatever its name.
    """

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.mlp = MLP(config)
        self.sandwich = config.sandwich_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = RMSNorm(config.dim, config.norm_eps)
            self.post_feedforward_layernorm = RMSNorm(config.dim, config.norm_eps)

    @property
    def mlp_norm(self) -> RMSNorm:
        return self.pre_feedforward_layernorm if self.sandwich else self.post_attention_layernorm

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, pos: Tensor, cache: KVCache) -> Tensor:
        h = self.self_attn(self.input_layernorm(x), cos, sin, mask, pos, cache)
        x = x + (self.post_attention_layernorm(h) if self.sandwich else h)
        h = self.mlp(self.mlp_norm(x))
        return x + (self.post_feedforward_layernorm(h) if self.sandwich else h)


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", rope_frequencies(config), persistent=False)
        if config.local_rope:
            self.register_buffer("inv_freq_local", rope_frequencies(config, local=True), persistent=False)

    def new_cache(self, max_len: int | None = None, batch: int = 1, kind: str = "fp") -> KVCache:
        """A cache on the model's device for up to `max_len` positions, stored as `kind` (KV_CACHE_TYPES)."""
        w = self.norm.weight
        return KVCache(self.config, max_len or self.config.max_seq_len, batch, w.dtype, w.device, kind)

    def forward(self, tokens: Tensor, positions: Tensor, cache: KVCache, last_only: bool = False,
                window: int | None = None) -> Tensor:
        """tokens, positions: [B, T] (positions equal across the batch) -> logits [B, T, V] in fp32.

        `last_only` computes the head for the last position only: prefill needs no more, and the
        head is a large share of the work (vocab x dim per token).

        Attention reads the first `window` cache slots (default `cache.window`); the caller keeps it
        >= 1 + the largest position. A small window, rounded up to a bucket, reads fewer slots without a
        host sync inside the step; passed as an argument it stays symbolic under torch.compile.
        """
        x = self.embed(tokens)
        rope = self._ropes(positions, x.dtype)
        masks = self._masks(positions, cache.window if window is None else window)
        pos = positions[0]
        for layer in self.layers:
            w = layer.self_attn.window
            cos, sin = rope[bool(w) and True in rope]
            x = layer(x, cos, sin, masks[w], pos, cache)
        if last_only:
            x = x[:, -1:]
        return self.lm_head(self.norm(x)).float()

    def forward_spans(self, tokens: Tensor, spans: list[Span], rows: int, head: bool = True) -> Tensor:
        """Several sequences in one pass: tokens [N] (the spans' rows, in order) -> logits [N, V] in fp32 (left
        unset without the `head`: a pass that only writes K/V).

        The norms and products see the pass as one matrix of `rows` >= N rows (zero-padded), so a row's arithmetic
        is the same in every pass of `rows` rows whatever else shares it (the fp products are not batch invariant
        across row counts, only across rows of one count); attention runs per span, on its own cache."""
        n = tokens.shape[0]
        if n > rows:
            raise ValueError(f"a shared pass of {rows} rows cannot hold {n}")
        positions = torch.cat([s.positions for s in spans])
        x = self.embed(F.pad(tokens, (0, rows - n))[None])
        rope = self._ropes(F.pad(positions, (0, rows - n))[None], x.dtype)
        for layer in self.layers:
            w = layer.self_attn.window
            cos, sin = rope[bool(w) and True in rope]
            x = layer(x, cos, sin, None, None, spans)
        if not head:
            return torch.empty(n, self.config.vocab_size, device=x.device)
        return self.lm_head(self.norm(x)).float()[0, :n]

    def _ropes(self, positions: Tensor, dtype: torch.dtype) -> dict[bool, tuple[Tensor, Tensor]]:
        """cos/sin of every position, by whether a layer is local (Gemma 3's sliding-window layers' own base)."""
        rope = {False: self._rotation(positions, self.inv_freq, dtype)}
        if self.config.local_rope:
            rope[True] = self._rotation(positions, self.inv_freq_local, dtype)
        return rope

    def _masks(self, positions: Tensor, window: int) -> dict[int, Tensor]:
        """Attention masks [B, 1, T, window] by layer window (0: causal over the whole cache)."""
        slots = torch.arange(window, device=positions.device)
        causal = (slots[None, None, :] <= positions[:, :, None])[:, None]
        masks = {w: causal & (slots[None, None, :] > positions[:, :, None] - w)[:, None]
                 for w in set(self.config.layer_windows) if w}
        return {0: causal, **masks}

    def embed(self, tokens: Tensor) -> Tensor:
        x = self.embed_tokens(tokens).to(self.norm.weight.dtype)  # a table held narrower (fp16, as stored) widens
        if self.config.embed_scale:  # sqrt(dim) rounded to the weights' dtype first, as Gemma's reference does
            x = x * torch.tensor(self.config.dim ** 0.5).to(x.dtype)
        return x

    @staticmethod
    def _rotation(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        angles = positions[..., None].float() * inv_freq  # [B, T, D/2]
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # [B, 1, T, D]
        return angles.cos().to(dtype), angles.sin().to(dtype)
