"""Peak memory figures every benchmark reports: process RSS, and GPU memory when CUDA is in use."""

from __future__ import annotations

import resource

import torch


def peak_memory() -> dict[str, float]:
    """{"peak_rss_mb": ...} plus "peak_gpu_mb" on CUDA; MB = MiB (ru_maxrss is KiB on Linux)."""
    figures = {"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if torch.cuda.is_available():
        figures["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return figures
