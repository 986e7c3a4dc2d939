"""The quantization tiers a first run chooses from by model size and device, and the choice.

Why tiers: the full method (rotation, AWQ, GPTQ, distillation) costs minutes a layer at 8B on a 2-core CPU,
and its distillation trains the whole model at once. A first run should take minutes, so larger models get
the cheaper steps that still fit. Light on purpose (no torch): the command line reads it for its help.
"""

from __future__ import annotations

from typing import Any

# The tiers a first run chooses from (`choose_tier`), cheapest last. Each is one method name in the cache key;
# docs/quantization.md has what each costs in perplexity on the real models and in time per layer.
TIERS = {
    "full": "rotation, AWQ scales, clipping, GPTQ, scale refit, rotated down_proj, then the distillation",
    "gptq": "the full method less the distillation (which holds the whole model and trains it)",
    "awq": "AWQ scales and clipping, rounded to nearest (no rotation, GPTQ, refit or distillation)",
    "rtn": "round to nearest: no calibration at all",
}
# Calibration (sequences x tokens) per tier on a CPU; a GPU takes default_calibration_size for every tier.
CPU_CALIBRATION = {"full": (32, 256), "gptq": (16, 256), "awq": (8, 256), "rtn": (1, 16)}

# Above this many decoder parameters a CPU first run takes the next tier down. The awq tier's first run of the
# Llama-3.2-1B shape took 3 min 15 s on the 2-core machine (344 CPU-s, 3.7 GB peak RSS, another test run beside
# it), the Llama-3.1-8B shape's 20 min 55 s on a quiet one (11.2 GB peak RSS); GPTQ and the scale refit alone (no
# search) took ~145 s a 1B layer there. rtn is not chosen: +32%
# perplexity on the embedded model against awq's +14% (docs/quantization.md).
CPU_TIER_LIMITS = (("full", 0.5e9), ("awq", float("inf")))
CPU_BF16_TIER_LIMITS = CPU_TIER_LIMITS


def decoder_params(config: Any) -> float:
    attn = config.dim * config.head_dim * (2 * config.n_heads + 2 * config.n_kv_heads)
    return config.n_layers * (attn + 3 * config.dim * config.intermediate_size)


def choose_tier(config: Any, device_type: str, fast_bf16: bool = False) -> str:
    """The method a first run ships for this model and device: the full one where it fits in minutes. A GPU
    runs the full method at every size people run (an 8B model's distillation fits an H200's memory)."""
    if device_type == "cuda":
        return "full"
    params = decoder_params(config)
    for tier, limit in CPU_BF16_TIER_LIMITS if fast_bf16 else CPU_TIER_LIMITS:
        if params <= limit:
            return tier
    return "rtn"
