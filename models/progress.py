"""Progress of long first-run work (download, quantization), reported through a callback the UI shows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Progress:
    stage: str  # "download" | "quantize" | "load"
    done: float  # units of `unit` done so far
    total: float  # 0 when unknown
    unit: str = ""  # "B" for bytes, "layer" for quantization
    detail: str = ""  # e.g. the file being downloaded, "layer 12/30, ETA 40s"
    eta_s: float | None = None


ProgressFn = Callable[[Progress], None]
