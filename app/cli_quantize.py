"""AWQ-quantize a model to INT4 into the Parley cache (what the first run does), and print the folder."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from ..models.quantize.tiers import TIERS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=None,
                        help="hub id (org/name[@rev]), local directory or .gguf file; default: this machine's default")
    parser.add_argument("--group-size", type=int, default=128, choices=(128, 64, 32),
                        help="input channels per scale (default 128; a smaller one is used where it does not divide)")
    parser.add_argument("--calib", nargs="+", default=None, metavar="FILE",
                        help="calibration text files, or 'builtin' / 'pile' (default: pile-val if reachable, "
                             "else the built-in corpus)")
    parser.add_argument("--samples", type=int, default=None, help="calibration samples (default 128 GPU / 32 CPU)")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sample (default 512 GPU / 256 CPU)")
    parser.add_argument("--device", default=None, help="where layers are quantized (default: cuda when available)")
    parser.add_argument("--rebuild", action="store_true", help="quantize again even if a valid cached folder exists")
    parser.add_argument("--method", default="auto", choices=("auto", *TIERS),
                        help="auto (default): the full method where it fits in minutes on this machine, cheaper "
                             "tiers above; " + "; ".join(f"{k}: {v}" for k, v in TIERS.items()))


def _calib(values: list[str] | None) -> str | list[str] | None:
    if values and len(values) == 1 and values[0] in ("builtin", "pile", "auto"):
        return values[0]
    return values


def run(args: argparse.Namespace) -> int:
    from ..models.quantize.cache import ensure_quantized
    from ..models.resolve import resolve
    from .cli import print_progress

    logging.basicConfig(level=logging.WARNING, format="parley: %(message)s", stream=sys.stderr)
    start = time.monotonic()
    files = resolve(args.model, progress=print_progress)
    out = ensure_quantized(files, group_size=args.group_size, calib=_calib(args.calib), n_samples=args.samples,
                           seq_len=args.seq_len, progress=print_progress, device=args.device,
                           rebuild=args.rebuild, method=args.method)
    elapsed = time.monotonic() - start
    try:
        manifest = json.loads((out.path / "manifest.json").read_text())
        built = f"quantization took {manifest['timing']['quantize_s']} s ({manifest['timing']['total_s']} s with " \
                f"loading and saving) when built {manifest['created']}; {manifest['calibration']}"
        note = manifest["settings"].get("group_size_note")
    except (OSError, ValueError, KeyError):  # an AWQ source used as it is: no manifest
        built, note = "an AWQ checkpoint already; nothing to quantize", None
    if note:
        print(f"note: {note}")
    print(f"{files.ref}: {elapsed:.1f} s this run; {built}")
    print(out.path)
    return 0
