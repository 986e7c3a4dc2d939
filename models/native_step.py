"""The Transformer's forward as one native call on the CPU (native_forward.cpp): a step `CachedModel` runs.

`Transformer.forward` stays the definition (the model carries no trace of this step); this computes the
same function with the decoder weights repacked for integer dot products (INT4 layers) or read in place
(fp32 layers), q/k/v and gate/up fused, and attention reading the KV cache in its stored form. Activations
entering each INT4 or int8 product are quantized to 8 bits per block of 64 inputs (32 for the MLP's down
projection and the int8 head, where 64 cost accuracy); `parley bench quality` measures the cost.
Every position is computed by the same arithmetic whatever the pass length, so logits are batch invariant.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import logging
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..kernels import native
from . import native_cache, native_forward
from .errors import ModelLoadError
from .progress import Progress, ProgressFn
from .quantize.int4_linear import Int4Linear
from .quantize.pack import quantize_weight
from .read_on_use import EmbeddingOnUse, ReadOnUse, RowBlocks, WeightOnUse
from .transformer import KVCache, Transformer

log = logging.getLogger(__name__)


def _interleave16(a: Tensor, b: Tensor, rows: int = 16) -> Tensor:
    """[I, ..] twice -> [2I, ..] as a[0:16], b[0:16], a[16:32], ... (gate/up pairs, by output row); `rows`: the
    rows of a block (1 for packed tensors, whose first dimension already counts blocks of 16 output rows)."""
    n = a.shape[0]
    out = torch.stack((a.reshape(n // rows, rows, *a.shape[1:]), b.reshape(n // rows, rows, *b.shape[1:])), dim=1)
    return out.reshape(2 * n, *a.shape[1:])


class NativeUnavailable(Exception):
    """Why a model runs on the PyTorch path instead (no compiler, a shape the kernels do not take, ...)."""


HEAD_GROUP = 64  # the 4-bit head's group size (a multiple of 64, as the INT4 kernel reads)
EMBED_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # Model.embed_dtype
EMBED_ROWS_GIVEN = 3  # Model.embed_dtype: `embed` holds the pass's own rows, fp32, in the order of its tokens


class NativeStep:
    """The model's forward as one call: `step(tokens, positions, cache, last_only) -> logits`, the same
    signature as `Transformer.forward` (the attention window is ignored: each row reads up to its position).

    Holds the packed weights (and keeps every tensor the library points at alive).
    """

    kind = "native"

    @classmethod
    def for_model(cls, model: Transformer, head_bits: int = 8, *, place: native_cache.Place | None = None,
                  progress: ProgressFn | None = None, head_gram: Callable[[], Tensor] | None = None) -> NativeStep:
        """The native step over `model`'s weights; NativeUnavailable says why it cannot be had.

        `place`: where the model's repacked weights are cached (an AWQ folder of the Parley cache, or a GGUF's
        layout folder): read from there when cached, else packed and cached there (models/native_cache.py).
        `head_gram`: the Gram matrix of the head's inputs, called only when a 4-bit head is packed: the head is
        then rounded by GPTQ (models/quantize/head4.py), else to nearest.
        """
        if os.environ.get("PARLEY_NATIVE", "1") == "0":
            raise NativeUnavailable("PARLEY_NATIVE=0")
        if model.norm.weight.device.type != "cpu" or model.norm.weight.dtype not in (torch.float32, torch.bfloat16):
            raise NativeUnavailable("the native step runs fp32 and bf16 models on the CPU")
        lib = native_forward.library()
        if lib is None:
            raise NativeUnavailable(native_forward.why_unavailable() or "the native library did not load")
        head = "gptq" if head_bits == 4 and head_gram is not None else ""
        rotated = model.layers[0].mlp.down_diag is not None  # hadamard.apply swapped in the rotated down_proj
        key = native_cache.cache_key(place, head_bits, head, rotated) if place is not None else None
        packed = native_cache.load(place.folder, key) if place is not None and key else None
        try:
            try:
                with native.reused_heap() if packed is None else contextlib.nullcontext():
                    step = cls(model, lib, head_bits, packed=packed, progress=progress, head_gram=head_gram)
            except native_cache.Stale as e:  # shapes the model does not imply: pack afresh
                log.warning("ignoring the cached CPU layout in %s (%s); repacking", place.folder, e)
                packed = None
                with native.reused_heap():
                    step = cls(model, lib, head_bits, progress=progress, head_gram=head_gram)
        except ModelLoadError:  # a damaged checkpoint read on use: no other path would run it
            raise
        except ValueError as e:
            raise NativeUnavailable(str(e)) from None
        if place is not None and key and packed is None and step.packed:
            native_cache.save_later(place, key, step.packed, native_cache.variant(head_bits, head, rotated))
        return step

    def __init__(self, model: Transformer, lib: ctypes.CDLL, head_bits: int = 8, *,
                 packed: dict[str, Tensor] | None = None, progress: ProgressFn | None = None,
                 head_gram: Callable[[], Tensor] | None = None) -> None:
        c = model.config
        self.lib, self.config = lib, c
        self.keep: list[Tensor] = []
        self._cached = packed  # repacked tensors from an earlier start, by name (None: pack them here)
        self.packed: dict[str, Tensor] = {}  # every repacked tensor by name, to cache for the next start
        # Each KV cache's view for the library, built on a cache's first use and dropped with the cache.
        self._caches: weakref.WeakKeyDictionary[KVCache, tuple] = weakref.WeakKeyDictionary()
        if c.intermediate_size % 16:
            raise ValueError(f"the native step needs intermediate_size % 16 == 0, not {c.intermediate_size}")
        if c.mlp_act not in ("silu", "gelu_tanh"):
            raise ValueError(f"the native step runs SiLU or tanh-GELU MLPs, not {c.mlp_act}")
        if c.head_dim > 512 or c.n_heads % c.n_kv_heads or c.n_heads // c.n_kv_heads > 8:
            raise ValueError("the native step needs head_dim <= 512 and at most 8 query heads per kv head")
        layers = (native_forward.Layer * c.n_layers)()
        started = time.monotonic()
        self.layer_bytes: list[int] = []  # what each layer's weights take (a view of the first layers reads less)
        for i, block in enumerate(model.layers):
            kept = len(self.keep)
            if progress is not None and packed is None and time.monotonic() - started > 0.5:
                progress(Progress("load", i, c.n_layers, "layer", f"preparing the CPU step: layer {i}/{c.n_layers}"))
            at, mlp = block.self_attn, block.mlp
            L = layers[i]
            L.attn_norm = self._ptr(block.input_layernorm.weight)
            L.ffn_norm = self._ptr(block.mlp_norm.weight)
            L.q_norm = self._ptr(at.q_norm.weight) if hasattr(at, "q_norm") else None
            L.k_norm = self._ptr(at.k_norm.weight) if hasattr(at, "k_norm") else None
            L.qkv = self._linear(f"{i}.qkv", [at.q_proj, at.k_proj, at.v_proj])
            L.o = self._linear(f"{i}.o", [at.o_proj])
            L.gate_up = self._linear(f"{i}.gate_up", [mlp.gate_proj, mlp.up_proj], interleave=True)
            L.down = self._linear(f"{i}.down", [mlp.down_proj], act_block=32)  # kernels/cpu/products.h: quantize_row
            if mlp.down_diag is not None:  # down_proj quantized on rotated inputs (models/quantize/hadamard.py)
                L.down_diag, L.down_block = self._ptr(mlp.down_diag), mlp.down_hadamard.shape[0]
            L.window = c.layer_windows[i]
            if block.sandwich:
                L.post_attn_norm = self._ptr(block.post_attention_layernorm.weight)
                L.post_ffn_norm = self._ptr(block.post_feedforward_layernorm.weight)
            self.layer_bytes.append(sum(t.numel() * t.element_size() for t in self.keep[kept:]))
        if progress is not None and packed is None and time.monotonic() - started > 0.5:  # the line's last figure
            progress(Progress("load", c.n_layers, c.n_layers, "layer", "preparing the CPU step: done"))
        self.layers = layers
        head_module = model.embed_tokens if c.tie_embeddings else model.lm_head
        head_w = head_module._parameters.get("weight")  # as held: a cached layout never reads one held on meta
        if not isinstance(head_w, Tensor) or head_w.dtype not in EMBED_DTYPES or (
                head_bits == 32 and head_w.dtype == torch.float16):
            raise ValueError("the native step needs the output head as an fp32 or bf16 weight (or fp16, quantized)")
        if head_bits == 8:
            if c.dim % 64:
                raise ValueError(f"the native head needs a hidden size divisible by 64, not {c.dim}")
            Np = (c.vocab_size + 15) // 16 * 16
            h = self._packed("head", lambda: native.pack_q8(self._read_head(head_module, blocks=True)),
                             {"q": ((Np // 16, c.dim // 64, 16, 16, 4), torch.uint8),
                              "s": ((c.vocab_size,), torch.float32)})
            head = native.lin(native.W_Q8, c.vocab_size, c.dim, 0, q=self._keep(h["q"]), s=self._keep(h["s"]))
        elif head_bits == 4:  # a large vocabulary's head (Gemma's 262k rows) as INT4
            if c.dim % 64:
                raise ValueError(f"the native head needs a hidden size divisible by 64, not {c.dim}")
            Np, G = (c.vocab_size + 15) // 16 * 16, c.dim // HEAD_GROUP
            h = self._packed("head", lambda: self._q4_head(self._read_head(head_module), head_gram, progress),
                             {"q": ((Np // 16, c.dim // 64, 8, 16, 4), torch.uint8),
                              "s16": ((Np // 16, G, 16), torch.int16), "z": ((Np // 16, G, 16), torch.uint8)})
            head = native.lin(native.W_Q4, c.vocab_size, c.dim, HEAD_GROUP, q=self._keep(h["q"]),
                              s16=self._keep(h["s16"]), z=self._keep(h["z"]))
        else:  # unquantized: the weight as held, fp32 or bf16
            head_w = head_module.weight
            kind = native.W_BF16 if head_w.dtype == torch.bfloat16 else native.W_F32
            head = native.lin(kind, c.vocab_size, c.dim, w=self._keep(head_w.detach().contiguous()))
        self.head_bits = head_bits
        # What a decode step reads: every layer and head weight once, plus one embedding row.
        table = model.embed_tokens
        embed = table._parameters["weight"]  # as held: a table read on use is decoded row by row, here
        self._lookup = table.lookup() if isinstance(table, EmbeddingOnUse) else None
        self.weight_bytes = sum(t.numel() * t.element_size() for t in self.keep
                                if t.data_ptr() != embed.data_ptr()) + c.dim * embed.element_size()
        if head_bits == 32 and c.tie_embeddings:  # the unquantized head is the embedding itself, skipped above
            self.weight_bytes += embed.numel() * embed.element_size()
        cos, sin = self._rope_table(c.max_seq_len, model.inv_freq)
        if c.local_rope:  # Gemma 3's sliding layers rotate with their own base
            local = self._rope_table(c.max_seq_len, model.inv_freq_local)
            for i in range(c.n_layers):
                if c.layer_windows[i]:
                    layers[i].rope_cos, layers[i].rope_sin = local
        # An embedding held narrower than fp32 (a bf16 model's; an INT4 model's fp16 table as stored) is read as
        # it is held, each looked-up row widened, not copied to fp32.
        # A table not held at all (a GGUF's, kept in its blocks) gives each pass its rows (`_model`).
        narrow = embed.dtype != torch.float32
        if self._lookup is not None:
            embed_ptr = None
        else:
            embed_ptr = self._keep(embed.detach().contiguous()).data_ptr() if narrow else self._ptr(embed)
        self.md = native_forward.Model(c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim,
                                       c.intermediate_size, c.vocab_size, c.norm_eps, embed_ptr,
                                       self._ptr(model.norm.weight), cos, sin, c.max_seq_len, head, layers)
        self.md.embed_dtype = EMBED_ROWS_GIVEN if self._lookup is not None else EMBED_DTYPES[embed.dtype]
        # sqrt(dim) rounded to fp32 first, as Transformer.embed does
        self.md.embed_scale = float(torch.tensor(c.dim ** 0.5, dtype=torch.float32)) if c.embed_scale else 0.0
        self.md.attn_scale = c.query_scale
        self.md.act = 1 if c.mlp_act == "gelu_tanh" else 0

    def first_layers(self, n: int) -> NativeStep:
        """The step of the model's first `n` layers with its final norm and head (a self-draft's): a view of this
        step's packed weights, nothing packed or copied again."""
        if not 1 <= n <= self.config.n_layers:
            raise ValueError(f"first_layers({n}): the model has {self.config.n_layers} layers")
        step = copy.copy(self)
        step.config = replace(self.config, n_layers=n, layer_windows=self.config.layer_windows[:n])
        step.layers = (native_forward.Layer * n)(*self.layers[:n])
        step.md = native_forward.Model.from_buffer_copy(self.md)
        step.md.n_layers = n
        step.md.layers = ctypes.cast(step.layers, ctypes.POINTER(native_forward.Layer))
        step._caches = weakref.WeakKeyDictionary()
        step.packed = {}  # nothing of its own to cache
        step.whole = self  # keeps the packed weights the layers point at alive
        step.layer_bytes = self.layer_bytes[:n]
        step.weight_bytes = self.weight_bytes - sum(self.layer_bytes[n:])
        return step

    @staticmethod
    def _read_head(module: nn.Module, blocks: bool = False) -> Tensor | RowBlocks:
        """The head's weight for packing; a head read on use (models/read_on_use.py) lets go of it again after.
        `blocks` (a packer that walks the rows in blocks): one whose checkpoint reads row blocks is read so."""
        if blocks and isinstance(module, WeightOnUse) and (rows := module.row_blocks()) is not None:
            return rows
        weight = module.weight
        if isinstance(module, ReadOnUse):
            module.release()
        return weight

    @staticmethod
    def _q4_head(weight: Tensor, gram: Callable[[], Tensor] | None = None,
                 progress: ProgressFn | None = None) -> dict[str, Tensor]:
        """The output head as INT4 in groups of 64 (asymmetric): ~0.55 bytes per weight against int8's ~1,
        for the head that is most of a large-vocabulary model's bytes per token. Rounded by GPTQ against the
        head's inputs when `gram` gives their Gram matrix, else to nearest."""
        N, K = weight.shape
        if gram is not None:
            from .quantize.head4 import gptq_head

            def rows(done: int, total: int) -> None:
                if progress is not None:
                    progress(Progress("load", done, total, "row", f"rounding the 4-bit head: row {done}/{total}"))

            return native.pack_q4(*gptq_head(weight, gram(), HEAD_GROUP, rows), HEAD_GROUP)
        parts = []
        w = weight.detach().float()
        w = torch.cat([w, w.new_zeros(-N % 16, K)])  # AWQ's packing takes whole groups of 8 rows
        for rows in w.split(16384):  # bounded temporaries over 262k rows
            parts.append(native.awq_to_q4(*quantize_weight(rows, HEAD_GROUP)))
        q, z, s = (torch.cat([p[j] for p in parts], dim=1)[:, :N] for j in range(3))
        return native.pack_q4(q, z, s, HEAD_GROUP)

    def _rope_table(self, n: int, inv_freq: Tensor) -> tuple[int, int]:
        """cos and sin [n, head_dim/2] for positions 0..n-1, as pointers (kept alive)."""
        angles = torch.arange(n, dtype=torch.float32)[:, None] * inv_freq.float()
        return self._keep(angles.cos().contiguous()).data_ptr(), self._keep(angles.sin().contiguous()).data_ptr()

    def _keep(self, t: Tensor) -> Tensor:
        self.keep.append(t)
        return t

    def _ptr(self, t: Tensor) -> int:
        t = t.detach()
        if t.dtype != torch.float32 or not t.is_contiguous():
            t = t.float().contiguous()
        return self._keep(t).data_ptr()

    def _packed(self, name: str, pack, shapes: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> dict[str, Tensor]:
        """`pack()`'s tensors, or the cached ones when they have exactly the shapes the model implies."""
        from .native_cache import Stale

        if self._cached is None:
            out = pack()
        else:
            out = {k: self._cached.get(f"{name}.{k}") for k in shapes}
            for k, (shape, dtype) in shapes.items():
                t = out[k]
                if t is None or tuple(t.shape) != shape or t.dtype != dtype:
                    raise Stale(f"{name}.{k}: expected {shape} {dtype}")
        self.packed.update({f"{name}.{k}": out[k] for k in shapes})
        return out

    def _linear(self, name: str, mods: list[nn.Module], interleave: bool = False, act_block: int = 64) -> native.Lin:
        """Fuse linears that share their input into one product (columns concatenated, or gate/up interleaved)."""
        if all(isinstance(m, Int4Linear) for m in mods):
            groups = {m.group_size for m in mods}
            if len(groups) != 1:
                raise ValueError("fused INT4 linears must share a group size")
            group = groups.pop()
            K, N = mods[0].in_features, sum(m.out_features for m in mods)
            with_mins = any(m.has_mins for m in mods)  # GGUF's Q4_1/Q4_K; zeros for the others

            def pack() -> dict[str, Tensor]:
                parts = [(q, z, s, torch.zeros_like(s) if mn is None else mn)
                         for q, z, s, mn in (m.q4_rows() for m in mods)]
                for m in mods:  # the packed copy is what runs: a module that can read its weights again lets go
                    m.release()
                if interleave:  # packed apart, then their 16-row blocks interleaved: half the bytes of q moved
                    a, b = (native.pack_q4_rows(q, z, s, group, mn if with_mins else None) for q, z, s, mn in parts)
                    return {k: _interleave16(a[k], b[k], rows=1) for k in a}
                q, z, s, mn = (torch.cat([p[j] for p in parts]) for j in range(4))
                return native.pack_q4_rows(q, z, s, group, mn if with_mins else None)

            if K % 64 or group % 32 or (group % 64 and group != 32):
                raise ValueError(f"the native step needs in_features ({K}) divisible by 64 and a group size of 32 "
                                 f"or a multiple of 64, not {group}")
            if group == 32 or with_mins:  # the products read these in blocks of 32 (products.h, q4_block)
                act_block = 32
            Np = (N + 15) // 16 * 16
            shapes = {"q": ((Np // 16, K // 64, 8, 16, 4), torch.uint8),
                      "s16": ((Np // 16, K // group, 16), torch.int16), "z": ((Np // 16, K // group, 16), torch.uint8)}
            if with_mins:
                shapes["m16"] = ((Np // 16, K // group, 16), torch.int16)
            packed = self._packed(name, pack, shapes)
            biases = [m.bias for m in mods]
            bias = self._keep(torch.cat([b.float() for b in biases]).contiguous()) if biases[0] is not None else None
            return native.lin(native.W_Q4, N, K, mods[0].group_size, q=self._keep(packed["q"]),
                              s16=self._keep(packed["s16"]), z=self._keep(packed["z"]), bias=bias, act_block=act_block,
                              m16=self._keep(packed["m16"]) if with_mins else None)
        if all(isinstance(m, nn.Linear) for m in mods):
            # Unquantized weights as held: fp32, or bf16 (a bf16 checkpoint, widened as the product reads it).
            # Fused linears are concatenated, gate/up too (the float products read [gate; up] halves, not the INT4
            # packer's interleave), and the modules then read their rows of the fused copy: weights held once.
            bf16 = all(m.weight.dtype == torch.bfloat16 for m in mods)
            ws = [m.weight.detach() if bf16 else m.weight.detach().float() for m in mods]
            w = self._keep((torch.cat(ws, dim=0) if len(ws) > 1 else ws[0]).contiguous())
            if len(mods) > 1:
                rows = 0
                for m in mods:
                    m.weight = nn.Parameter(w[rows:rows + m.out_features], requires_grad=m.weight.requires_grad)
                    rows += m.out_features
            bias = None
            if mods[0].bias is not None:
                bias = self._keep(torch.cat([m.bias.detach().float() for m in mods]).contiguous())
            return native.lin(native.W_BF16 if bf16 else native.W_F32, w.shape[0], w.shape[1], w=w, bias=bias)
        raise ValueError(f"the native step takes INT4 or fp32 nn.Linear layers, not {type(mods[0]).__name__}")

    def _cache(self, cache: KVCache) -> native.Cache:
        if cache not in self._caches:
            kvs = (native.KV * cache.n_layers)()
            for i in range(cache.n_layers):
                def p(name: str, i: int = i) -> int | None:
                    t = getattr(cache, f"{name}{i}", None)
                    return None if t is None else t.data_ptr()
                kvs[i] = native.KV(p("k"), p("v"), p("ks"), p("vs"), p("vm"))
            kind = cache.kind
            if kind == "fp" and cache.dtype == torch.bfloat16:  # a bf16 model's "fp" cache: the bf16 kind's layout
                kind = "bf16"
            elif kind == "fp" and cache.dtype != torch.float32:
                raise ValueError("the native step reads fp32, bf16, int8 or k8v4 caches")
            self._caches[cache] = (native.Cache(native.KV_KINDS[kind], cache.max_len, kvs), kvs)
        return self._caches[cache][0]

    def __call__(self, tokens: Tensor, positions: Tensor, cache: KVCache, last_only: bool = False,
                 window: int | None = None) -> Tensor:
        """tokens, positions [1, T] -> logits [1, T or 1, vocab] fp32; writes the T positions' K/V."""
        if tokens.shape[0] != 1:
            raise ValueError("the native step runs one sequence at a time")
        T = tokens.shape[1]
        ids = tokens[0].to(torch.int64).contiguous()
        pos = positions[0].to(torch.int64).contiguous()
        md, _rows = self._model(ids)
        out = torch.empty(1 if last_only else T, self.config.vocab_size, dtype=torch.float32)
        rc = self.lib.parley_forward(md, ctypes.byref(self._cache(cache)), T, ids.data_ptr(),
                                     pos.data_ptr(), int(last_only), out.data_ptr())
        if rc != 0:
            raise ValueError(f"positions {pos.tolist()[:4]}... exceed the cache ({cache.max_len} slots) "
                             f"or the model's {self.config.max_seq_len} positions")
        return out[None]

    def _model(self, ids: Tensor | list[int]) -> tuple[Any, Tensor | None]:
        """The Model to pass with token ids [M] (checked against the vocabulary), and the embedding rows it points
        at where this step looks them up itself (`EMBED_ROWS_GIVEN`): the caller holds them through the pass."""
        lo, hi = (min(ids), max(ids)) if isinstance(ids, list) else (int(ids.min()), int(ids.max()))
        if hi >= self.config.vocab_size or lo < 0:
            raise ValueError(f"token id out of range for a vocabulary of {self.config.vocab_size}")
        if self._lookup is None:
            return ctypes.byref(self.md), None
        if isinstance(ids, list):
            ids = torch.tensor(ids, dtype=torch.int64)
        rows = self._lookup(ids).to(torch.float32).contiguous()
        if rows.shape != (len(ids), self.config.dim):
            raise ValueError(f"the embedding gave rows {tuple(rows.shape)} for {len(ids)} tokens")
        self.md.embed = rows.data_ptr()
        return ctypes.byref(self.md), rows

    def tree(self, tokens: list[int], parents: list[int], base: int, cache: KVCache) -> Tensor:
        """Logits [N, vocab] of a tree of tokens (node 0 at position `base`, node m the child of parents[m] <
        m, at its parent's position + 1), writing node m's K/V to slot base + m; each node attends the cache
        below `base` and its own ancestors, bitwise as the linear pass over its path would."""
        n = len(tokens)
        depth = [0] * n
        for m in range(1, n):
            depth[m] = depth[parents[m]] + 1
        ids = torch.tensor(tokens, dtype=torch.int64)
        pos = torch.tensor([base + d for d in depth], dtype=torch.int64)
        par = torch.tensor(parents, dtype=torch.int64)
        md, _rows = self._model(ids)
        out = torch.empty(n, self.config.vocab_size, dtype=torch.float32)
        rc = self.lib.parley_forward_tree(md, ctypes.byref(self._cache(cache)), n, ids.data_ptr(),
                                          pos.data_ptr(), par.data_ptr(), 0, out.data_ptr())
        if rc == -3:
            raise ValueError(f"parents {parents[:8]}...: expected parents[0] = -1 and 0 <= parents[m] < m")
        if rc != 0:
            raise ValueError(f"a tree of {n} nodes at position {base} exceeds the cache ({cache.max_len} slots) "
                             f"or the model's {self.config.max_seq_len} positions")
        return out

    def batch(self, parts: list[tuple[KVCache, list[int], list[int], list[int] | None, int]]) -> list[Tensor]:
        """One pass over several sequences, each (cache, tokens, positions, parents, wanted): its rows write their
        K/V into its cache and attend that cache only (`parents` None: a linear pass; else a tree, as `tree`, its
        positions the root's + depth). Returns per part the logits [len(tokens) - wanted, vocab] of its rows from
        `wanted` on (a prefill chunk wants none; a decode or verification round all). The products take every row
        of the pass as one matrix, row by row the same arithmetic: each part's logits are bitwise those of its
        pass alone."""
        if not parts:
            return []
        any_tree = any(p[3] is not None for p in parts)
        tokens, positions, parents, out_rows, rows = [], [], [], [], []
        for _, ids, pos, par, wanted in parts:
            if not ids or len(pos) != len(ids) or not 0 <= wanted <= len(ids):
                raise ValueError(f"a part of {len(ids)} tokens, {len(pos)} positions, logits from row {wanted}")
            out_rows.extend(range(len(tokens) + wanted, len(tokens) + len(ids)))
            tokens += ids
            positions += pos
            rows.append(len(ids))
            if any_tree:
                parents += par if par is not None else range(-1, len(ids) - 1)
        # numpy, not torch, for the pass's index arrays: four torch.tensor calls and a split cost ~0.1 ms a pass,
        # ~4% of a decode step of the embedded model
        md, _rows = self._model(tokens)
        ids = np.array(tokens, dtype=np.int64)
        pos = np.array(positions, dtype=np.int64)
        par = np.array(parents, dtype=np.int64) if any_tree else None
        seq_rows = np.array(rows, dtype=np.int32)
        wanted = np.array(out_rows, dtype=np.int32)
        caches = (ctypes.POINTER(native.Cache) * len(parts))(*(ctypes.pointer(self._cache(p[0])) for p in parts))
        out = torch.empty(len(out_rows), self.config.vocab_size, dtype=torch.float32)
        rc = self.lib.parley_forward_batch(md, len(parts), caches, seq_rows.ctypes.data,
                                           ids.ctypes.data, pos.ctypes.data, None if par is None else par.ctypes.data,
                                           len(out_rows), wanted.ctypes.data, out.data_ptr())
        if rc == -3:
            raise ValueError("a part's parents are not a tree (parents[0] = -1, 0 <= parents[m] < m)")
        if rc != 0:
            raise ValueError(f"a pass of {len(parts)} sequences: positions exceed a cache or the model's "
                             f"{self.config.max_seq_len} positions (code {rc})")
        return [out] if len(parts) == 1 else list(out.split([len(p[1]) - p[4] for p in parts]))

    def move_slots(self, cache: KVCache, src: list[int], dst: list[int]) -> None:
        """Copy the K/V of slots src[i] to dst[i] in order, every layer (a tree's accepted path into place)."""
        c = self.config
        s, d = torch.tensor(src, dtype=torch.int64), torch.tensor(dst, dtype=torch.int64)
        if self.lib.parley_kv_move(ctypes.byref(self._cache(cache)), c.n_layers, c.n_kv_heads, c.head_dim, len(src),
                                   s.data_ptr(), d.data_ptr()) != 0:
            raise ValueError(f"slots {src} -> {dst} outside the cache's {cache.max_len}")
