"""The dtype unquantized weights are held in, chosen before anything is read, so a model that cannot fit fails
in one line instead of swapping the machine to a halt.

On a GPU that is bf16. On a CPU it is bf16 where the CPU has bf16 dot products (AVX512-BF16 / AMX: then bf16
matmuls are as fast as fp32 ones at half the bytes), else fp32, which the native step and the exact reference
tests run, only where it fits in the memory available now; otherwise the load is refused with the size it
needs and what to do (the INT4 weights are a quarter of the bf16 size). The loader converts one tensor at a
time as it places it (loading.assemble builds on the meta device), so the peak is the held weights plus one
tensor, never an fp32 model beside a bf16 one.
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


def cpu_weights_dtype(config: ModelConfig, source: str, *, bf16_dot: bool | None = None,
                      available: int | None = None) -> torch.dtype:
    """bf16 where the CPU has bf16 dot products, fp32 where it fits, else a ModelLoadError with the sizes."""
    if bf16_dot is None:
        from .quantize.cache import fast_cpu_bf16

        bf16_dot = fast_cpu_bf16()
    if bf16_dot:
        return torch.bfloat16
    available = available_bytes() if available is None else available
    need = parameter_count(config) * 4
    if available is None or need + HEADROOM <= available:
        return torch.float32
    gb = 1e9
    raise ModelLoadError(
        f"{source}: --quant none needs {need / gb:.1f} GB for fp32 weights (this CPU has no bf16 dot products, "
        f"so they are not kept in bf16) and {available / gb:.1f} GB is available; use --quant awq (INT4, about "
        f"{int4_bytes(config) / gb:.1f} GB)")


def weights_dtype(config: ModelConfig, device: torch.device, source: str) -> torch.dtype:
    """The dtype of unquantized weights on `device` (bf16 on a GPU)."""
    return torch.bfloat16 if device.type == "cuda" else cpu_weights_dtype(config, source)
