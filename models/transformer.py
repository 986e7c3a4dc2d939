"""A decoder-only transformer for the llama, mistral, qwen2 and qwen3 families, in plain PyTorch.

One `forward` serves prefill, one-token decode and the verification of k+1 speculated tokens: it takes
token ids and their absolute positions, writes their keys/values into a preallocated cache and attends
over everything the cache holds up to each position. Parameter names follow Hugging Face checkpoints
(minus the leading `model.`), so loading is a name-for-name copy.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig


class KVCache(nn.Module):
    """Keys and values of every layer in static buffers, one pair per layer: [batch, kv_heads, max_len, head_dim].

    Slot i holds position i. Truncating is setting `length`: stale slots beyond it are hidden by the
    causal mask (a query at position p sees slots <= p) and overwritten by the next tokens, so rolling
    back rejected speculative tokens costs nothing. Separate buffers per layer keep an in-place write
    a write of that layer only, also under torch.compile.
    """

    def __init__(self, config: ModelConfig, max_len: int, batch: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        super().__init__()
        shape = (batch, config.n_kv_heads, max_len, config.head_dim)
        self.n_layers = config.n_layers
        for i in range(config.n_layers):
            self.register_buffer(f"k{i}", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
            self.register_buffer(f"v{i}", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.max_len = max_len
        self.length = 0  # leading slots holding valid positions; kept by the caller, which knows them
        # How many slots attention reads; set by the caller per forward so shapes stay few (bucketed).
        self.window = max_len

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.max_len:
            raise ValueError(f"cannot truncate a cache of {self.max_len} slots to {length}")
        self.length = length

    def update(self, layer: int, pos: Tensor, k: Tensor, v: Tensor, window: int) -> tuple[Tensor, Tensor]:
        """Write k/v [B, H, T, D] at slots `pos` [T]; return this layer's first `window` slots."""
        k_cache, v_cache = getattr(self, f"k{layer}"), getattr(self, f"v{layer}")
        k_cache.index_copy_(2, pos, k)
        v_cache.index_copy_(2, pos, v)
        return k_cache[:, :, :window], v_cache[:, :, :window]

    @property
    def k(self) -> Tensor:
        """All layers' keys stacked [layers, B, H, max_len, D] (a copy, for inspection and tests)."""
        return torch.stack([getattr(self, f"k{i}") for i in range(self.n_layers)])

    @property
    def v(self) -> Tensor:
        return torch.stack([getattr(self, f"v{i}") for i in range(self.n_layers)])


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


def rope_frequencies(config: ModelConfig) -> Tensor:
    """Inverse frequencies per rotary pair, with llama3-style or linear scaling when configured."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    scaling = config.rope_scaling or {}
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
    return inv_freq.float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate halves ([x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin]), the Hugging Face layout."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        c = config
        self.layer, self.n_heads, self.n_kv_heads, self.head_dim = layer, c.n_heads, c.n_kv_heads, c.head_dim
        self.q_proj = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=False)
        if c.qk_norm:  # qwen3 normalises each head's q and k before rotation
            self.q_norm = RMSNorm(c.head_dim, c.norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, pos: Tensor, cache: KVCache) -> Tensor:
        B, T, _ = x.shape
        window = mask.shape[-1]
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = cache.update(self.layer, pos, k, v, window)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.n_heads != self.n_kv_heads)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.dim, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.dim, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, pos: Tensor, cache: KVCache) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, pos, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


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

    def new_cache(self, max_len: int | None = None, batch: int = 1) -> KVCache:
        """A cache on the model's device, in its activation dtype, for up to `max_len` positions."""
        w = self.norm.weight
        return KVCache(self.config, max_len or self.config.max_seq_len, batch, w.dtype, w.device)

    def forward(self, tokens: Tensor, positions: Tensor, cache: KVCache, last_only: bool = False,
                window: int | None = None) -> Tensor:
        """tokens, positions: [B, T] (positions equal across the batch) -> logits [B, T, V] in fp32.

        `last_only` computes the head for the last position only: prefill needs no more, and the
        head is a large share of the work (vocab x dim per token).

        Attention reads the first `window` cache slots (default `cache.window`); the caller keeps it
        >= 1 + the largest position. A small window, rounded up to a bucket, reads fewer slots without a
        host sync inside the step; passed as an argument it stays symbolic under torch.compile.
        """
        x = self.embed_tokens(tokens)
        angles = positions[..., None].float() * self.inv_freq  # [B, T, D/2]
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # [B, 1, T, D]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        slots = torch.arange(cache.window if window is None else window, device=tokens.device)
        mask = (slots[None, None, :] <= positions[:, :, None])[:, None]  # [B, 1, T, window]
        pos = positions[0]
        for layer in self.layers:
            x = layer(x, cos, sin, mask, pos, cache)
        if last_only:
            x = x[:, -1:]
        return self.lm_head(self.norm(x)).float()
