"""The quantization methods: the `AWQSettings` each tier runs (tiers.py says which tier a first run takes), the
calibration each uses, and the method's name in the cache key (cache.py).

A first run ships the full method; the cheaper tiers leave steps out. What each step buys, and what did not pay,
is in docs/quantization.md.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from . import hadamard
from .awq import AWQSettings
from .distill import DistillSettings
from .tiers import CPU_CALIBRATION, TIERS

# The distillation (distill.py) draws from this many times AWQ's calibration sequences: on the embedded
# model 64 x 256 tokens did better than 32 (docs/quantization.md); AWQ calibrates on every other one.
DISTILL_SAMPLES = 2


def default_calibration_size(device: torch.device) -> tuple[int, int]:
    """(samples, tokens each): AWQ's 128 x 512 on an accelerator, 32 x 256 on a CPU (minutes, not an hour)."""
    return (128, 512) if device.type == "cuda" else (32, 256)


def calibration_size(tier: str, device: torch.device) -> tuple[int, int]:
    return default_calibration_size(device) if device.type == "cuda" else CPU_CALIBRATION[tier]


def evenly(tokens: Tensor, n: int) -> Tensor:
    """n of the sequences [N, T], evenly spaced (AWQ's share of the distillation's calibration)."""
    return tokens[torch.linspace(0, len(tokens) - 1, n).round().long()] if len(tokens) > n else tokens


def fast_cpu_bf16() -> bool:
    """Whether this CPU has native bf16 dot products (then bf16 matmuls are ~4x fp32 ones)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def first_run_settings(group_size: int, device: torch.device) -> AWQSettings:
    """The quantization a first run ships: AWQ scales on a rotated residual stream, every linear clipped (q and
    k too), rounded with GPTQ, scales refit, and down_proj also quantized on its input rotated at run time
    (hadamard.py), which is why it gets no AWQ scale: measured with and without, over three seeds, unscaled
    was better (docs/quantization.md, for what each step buys and what did not pay)."""
    awq = AWQSettings(group_size=group_size, rotate=True, gptq=True, refit_scales=True, scale_down=False,
                      clip_qk=True, hadamard_down=hadamard.BLOCK, distill=DistillSettings())
    if device.type == "cuda":
        awq.distill_dtype = torch.bfloat16  # the model is fp16 there; gradients want bf16's range
    elif device.type == "cpu":  # minutes, not an hour: see AWQSettings for what these trade
        # The distillation after it has the last word on every scale, so AWQ's own search can be coarse.
        awq.search_samples, awq.alpha_grid = 4, 10
        if fast_cpu_bf16():
            awq.search_dtype = awq.distill_dtype = torch.bfloat16
    return awq


def tier_settings(tier: str, group_size: int, device: torch.device) -> AWQSettings:
    """The AWQSettings of a tier (`TIERS`)."""
    if tier not in TIERS:
        raise ValueError(f"unknown quantization method {tier!r}; choose one of {', '.join(TIERS)} or auto")
    awq = first_run_settings(group_size, device)
    if tier == "full":
        return awq
    awq = dataclasses.replace(awq, distill=None)
    cpu = device.type != "cuda"
    if tier == "gptq" and cpu:  # the block-output search runs every alpha on this many sequences
        awq = dataclasses.replace(awq, search_samples=2)
    if tier in ("awq", "rtn"):
        awq = dataclasses.replace(awq, gptq=False, refit_scales=False)
    if tier == "awq" and cpu:  # a coarse search: one sequence, 5 alphas, 5 clipping ranges (each end), and
        # the standard down_proj (other engines'; Parley runs the rotated one) rounded on its plain range
        awq = dataclasses.replace(awq, search_samples=1, alpha_grid=5, n_grid=10, clip_standard_down=False)
    if tier == "rtn":
        awq = dataclasses.replace(awq, awq_scales=False, clip=False, clip_qk=False)
    return awq


def method_name(awq: AWQSettings) -> str:
    """What the cache key and manifest call the method: a folder built by another method is never reused."""
    scaled = "awq" if awq.scale_down else "awq-no-down-scale"
    steps = (["rotate"] * awq.rotate + [scaled if awq.awq_scales else "clip" if awq.clip else "rtn"]
             + ["clip-qk"] * awq.clip_qk
             + ["gptq-act-order" if awq.act_order else "gptq"] * awq.gptq)
    steps += ["refit"] * awq.refit_scales + [f"hadamard-down{awq.hadamard_down}"] * bool(awq.hadamard_down)
    steps += ["distill"] * bool(awq.distill)
    return "+".join(steps)


def applied_method(settings: dict[str, Any]) -> str:
    """The method a folder's manifest says was applied: its key names the first-run method, whose rotation
    is skipped for models that cannot be rotated (Gemma 3's sandwich norms; `rotated` false)."""
    steps = str(settings.get("method", "awq")).split("+")
    return "+".join(s for s in steps if s != "rotate" or settings.get("rotated", True))
