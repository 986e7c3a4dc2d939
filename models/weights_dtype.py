"""The dtype unquantized weights are held in, chosen before anything is read, so a model that cannot fit fails
in one line instead of swapping the machine to a halt.

On a GPU that is bf16. On a CPU the weights are held as the checkpoint stores them where that fits: a bf16
checkpoint (what the hub's models are) stays bf16, and the native step widens each weight to fp32 as it
multiplies (the fp32 product's arithmetic on the same values, at half the bytes: exact and batch invariant);
an fp32 or dequantized one (a GGUF's blocks) stays fp32. Where fp32 does not fit the weights are rounded to
bf16, and where bf16 does not fit either the load is refused with the size it needs and what to do (the INT4
weights are a quarter of the bf16 size). The loader converts one tensor at a time as it places it
(loading.assemble builds on the meta device), so the peak is the held weights plus one tensor, never an fp32
model beside a bf16 one.
"""

from __future__ import annotations

import torch

from .config import ModelConfig
from .errors import ModelLoadError

HEADROOM = 1.0e9  # bytes left to the KV cache, activations, the tokenizer and the app


def parameter_count(config: ModelConfig) -> int:
    """Weights the model holds (the tied head counted once)."""
    d, hd, f = config.dim, config.head_dim, config.intermediate_size
    q, kv = config.n_heads * hd, config.n_kv_heads * hd
    layer = d * (q + 2 * kv) + q * d + 3 * d * f + 2 * d + (q + 2 * kv if config.qkv_bias else 0)
    heads = 1 if config.tie_embeddings else 2
    return heads * config.vocab_size * d + config.n_layers * layer + d


def int4_bytes(config: ModelConfig) -> int:
    """What the INT4 engine holds on a CPU: decoder weights at 4.31 bits (groups of 128, fp16 scales and
    zeros), the embedding in fp32 and the int8 head."""
    table = config.vocab_size * config.dim
    decoder = parameter_count(config) - table * (1 if config.tie_embeddings else 2)
    return int(decoder * 4.31 / 8 + table * 4 + table)


def available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (what can be allocated without swapping), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def stored_dtype(files) -> torch.dtype | None:
    """The floating dtype a safetensors checkpoint stores its weights in (its first shard's header), None for a
    GGUF file (its blocks are dequantized to fp32) or where the header says nothing clear."""
    from safetensors import safe_open

    from .resolve import weight_files

    if getattr(files, "kind", None) != "dir":
        return None
    try:
        with safe_open(files.path / weight_files(files.path)[0], framework="pt") as f:
            kinds = {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    except Exception:  # a damaged file is the loader's to report, with its own words
        return None
    floats = kinds & {"BF16", "F16", "F32", "F64"}
    return {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}.get(floats.pop()) \
        if len(floats) == 1 else None


def cpu_weights_dtype(config: ModelConfig, source: str, *, stored: torch.dtype | None = None,
                      available: int | None = None) -> torch.dtype:
    """bf16 for a bf16 checkpoint, else fp32 where it fits, else bf16 where that fits, else a ModelLoadError."""
    available = available_bytes() if available is None else available
    params = parameter_count(config)
    if stored == torch.bfloat16:
        need, kept = params * 2, torch.bfloat16
    elif available is None or params * 4 + HEADROOM <= available:
        return torch.float32
    else:
        need, kept = params * 2, torch.bfloat16
    if available is None or need + HEADROOM <= available:
        return kept
    gb = 1e9
    raise ModelLoadError(
        f"{source}: --quant none needs {need / gb:.1f} GB for bf16 weights ({params * 4 / gb:.1f} GB in fp32) and "
        f"{available / gb:.1f} GB is available; use --quant awq (INT4, about {int4_bytes(config) / gb:.1f} GB)")


def weights_dtype(config: ModelConfig, device: torch.device, source: str, files=None) -> torch.dtype:
    """The dtype of unquantized weights on `device` (bf16 on a GPU); `files`: the checkpoint, to read what it
    stores."""
    if device.type == "cuda":
        return torch.bfloat16
    return cpu_weights_dtype(config, source, stored=stored_dtype(files) if files is not None else None)
