"""What every `parley bench` shares: medians, peak memory, and printing results as JSON or a table.

Imports nothing heavy, so `parley --help` stays fast; torch is looked at only if a bench loaded it.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def peer_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a peer (llama.cpp): this one less the OpenMP settings importing parley made, so a
    peer runs as its users run it."""
    import os

    from .. import OPENMP_SET

    return {**{k: v for k, v in os.environ.items() if k not in OPENMP_SET}, **(extra or {})}


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def median_run(runs: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run whose `key` is the median (the upper one of an even count): a real run, not a blend."""
    return sorted(runs, key=lambda r: r[key])[len(runs) // 2]


def peak_memory() -> dict[str, float]:
    """{"peak_rss_mb": ...} plus "peak_gpu_mb" when CUDA was used; MB = MiB (ru_maxrss is KiB on Linux)."""
    figures = {"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        figures["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return figures


def _status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Start a new peak-RSS window (Linux: /proc/self/clear_refs 5), so a figure excludes loading's peak."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss_since_reset() -> dict[str, float]:
    """{"peak_rss_in_use_mb": peak RSS since `reset_peak_rss`, "rss_mb": RSS now}, where Linux tells."""
    peak, now = _status_mb("VmHWM"), _status_mb("VmRSS")
    return {k: v for k, v in (("peak_rss_in_use_mb", peak), ("rss_mb", now)) if v is not None}


def memory_line(results: dict[str, Any]) -> str:
    gpu = f", peak GPU {results['peak_gpu_mb']} MB" if "peak_gpu_mb" in results else ""
    return f"peak RSS {results['peak_rss_mb']} MB{gpu}"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """Rows as aligned text columns: the first left-aligned, the others right-aligned."""
    cells = [[str(h) for h in header]] + [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in cells]


def emit(results: dict[str, Any], as_json: bool, lines: Callable[[dict[str, Any]], Iterable[str]]) -> int:
    """Add peak memory to `results`, then print them as one JSON object or as `lines(results)` and memory."""
    results.update(peak_memory())
    if as_json:
        print(json.dumps(results))
    else:
        for line in lines(results):
            print(line)
        print(memory_line(results))
    return 0
