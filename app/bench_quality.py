"""Perplexity on held-out text of the fp32, RTN INT4 and AWQ INT4 models, in one run (what INT4 costs).

The text is `assets/heldout/` (not in the calibration corpus), cut into chunks of --chunk tokens; each
chunk is scored on its second half only, so every scored token has at least half a chunk of context.
RTN and AWQ use the same group size. By default (`--kernels reference`) each INT4 linear is dequantized
once to the fp32 matrix the reference kernel would multiply by, so the figures measure the quantization
alone (and the run takes minutes, not an hour of per-call dequantization); `--kernels auto` runs the
device's fast INT4 path instead.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from pathlib import Path

from .peak_memory import peak_memory

HELDOUT_DIR = Path(__file__).resolve().parents[1] / "assets" / "heldout"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model to measure (default: this machine's default)")
    parser.add_argument("--group-size", type=int, default=128, choices=(128, 64, 32),
                        help="requested group size for RTN and AWQ (a smaller one is used where it does not divide)")
    parser.add_argument("--text", nargs="+", default=None, metavar="FILE",
                        help="held-out text (default: assets/heldout)")
    parser.add_argument("--chunk", type=int, default=512, help="tokens per chunk (the second half is scored)")
    parser.add_argument("--max-chunks", type=int, default=None, help="score at most this many chunks")
    parser.add_argument("--calib", nargs="+", default=None, metavar="FILE",
                        help="AWQ calibration (as for `parley quantize`)")
    parser.add_argument("--samples", type=int, default=None, help="AWQ calibration samples")
    parser.add_argument("--seq-len", type=int, default=None, help="AWQ calibration tokens per sample")
    parser.add_argument("--kernels", choices=("reference", "auto"), default="reference",
                        help="INT4 matmul path (default: reference, exact)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def perplexity(model, chunks) -> float:
    """exp(mean NLL) of the second half of every chunk [n, T], each run from an empty cache."""
    import torch
    import torch.nn.functional as F

    nll, count = 0.0, 0
    with torch.inference_mode():
        for row in chunks:
            t = row.numel()
            cache = model.new_cache(t)
            cache.window = t
            logits = model(row[None], torch.arange(t)[None], cache)[0]
            half = t // 2
            # logits at position p predict token p + 1: score tokens half .. t-1
            nll += F.cross_entropy(logits[half - 1: t - 1].float(), row[half:], reduction="sum").item()
            count += t - half
    return math.exp(nll / count)


def dequantized(model):
    """Every Int4Linear replaced by an nn.Linear holding exactly the weight the reference kernel computes
    with (same values, dequantized once instead of on every call)."""
    import torch
    from torch import nn

    from ..kernels.reference import dequantize
    from ..models.quantize.int4_linear import Int4Linear, decoder_linears

    for parent, name, lin in decoder_linears(model):
        if isinstance(lin, Int4Linear):
            dense = nn.Linear(lin.in_features, lin.out_features, bias=lin.bias is not None)
            with torch.no_grad():
                dense.weight.copy_(dequantize(lin.qweight, lin.qzeros, lin.scales.float(), lin.group_size).t())
                if lin.bias is not None:
                    dense.bias.copy_(lin.bias)
            setattr(parent, name, dense)
    return model


def run(args: argparse.Namespace) -> int:
    if args.kernels == "reference":
        os.environ["PARLEY_KERNELS"] = "reference"
    import logging

    import torch

    from ..models.loading import load_model
    from ..models.quantize.awq import model_group_size, rtn_quantize
    from ..models.quantize.cache import ensure_quantized
    from ..models.resolve import resolve
    from ..models.tokenizer import load_tokenizer
    from .cli import print_progress
    from .cli_quantize import _calib

    logging.basicConfig(level=logging.WARNING, format="parley: %(message)s", stream=sys.stderr)
    say = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    files = resolve(args.model, progress=print_progress)
    tok = load_tokenizer(files)
    texts = [Path(p) for p in args.text] if args.text else sorted(HELDOUT_DIR.glob("*.txt"))
    ids = []
    for f in texts:
        ids += tok.encode(f.read_text(encoding="utf-8").strip() + "\n\n")
    n = len(ids) // args.chunk
    if args.max_chunks:
        n = min(n, args.max_chunks)
    if n == 0:
        raise ValueError(f"held-out text has {len(ids)} tokens, fewer than one chunk of {args.chunk}")
    chunks = torch.tensor(ids[: n * args.chunk]).view(n, args.chunk)
    say(f"held-out text: {', '.join(t.name for t in texts)}: {len(ids)} tokens -> {n} chunks of {args.chunk}, "
        f"{n * (args.chunk - args.chunk // 2)} scored")

    results: dict[str, dict] = {}
    fp = load_model(files, dtype=torch.float32)
    group = model_group_size(fp, args.group_size)
    t0 = time.monotonic()
    results["fp32"] = {"ppl": perplexity(fp, chunks), "seconds": time.monotonic() - t0}
    say(f"fp32        ppl {results['fp32']['ppl']:.3f}")

    rtn = copy.deepcopy(fp)
    del fp
    rtn_quantize(rtn, group)
    if args.kernels == "reference":
        dequantized(rtn)
    t0 = time.monotonic()
    results["rtn_int4"] = {"ppl": perplexity(rtn, chunks), "seconds": time.monotonic() - t0, "group_size": group}
    del rtn
    say(f"RTN  g{group:<4}  ppl {results['rtn_int4']['ppl']:.3f}")

    t0 = time.monotonic()
    awq_files = ensure_quantized(files, group_size=args.group_size, calib=_calib(args.calib),
                                 n_samples=args.samples, seq_len=args.seq_len, progress=print_progress)
    manifest = json.loads((awq_files.path / "manifest.json").read_text())
    awq = load_model(awq_files, dtype=torch.float32)
    if args.kernels == "reference":
        dequantized(awq)
    load_s = time.monotonic() - t0
    t0 = time.monotonic()
    results["awq_int4"] = {"ppl": perplexity(awq, chunks), "seconds": time.monotonic() - t0,
                           "group_size": manifest["settings"]["group_size_used"],
                           "quantize_s": manifest["timing"]["quantize_s"], "cache_load_s": load_s,
                           "calibration": manifest["calibration"], "folder": str(awq_files.path)}
    say(f"AWQ  g{group:<4}  ppl {results['awq_int4']['ppl']:.3f}")

    base = results["fp32"]["ppl"]
    for r in results.values():
        r["vs_fp32"] = r["ppl"] / base - 1
    summary = {
        "bench": "quality", "model": files.ref, "text": [t.name for t in texts], "chunk": args.chunk,
        "chunks": n, "scored_tokens": n * (args.chunk - args.chunk // 2), "group_size": group,
        "kernels": args.kernels, "results": results, **peak_memory(),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        say(f"\n{'model':<10} {'ppl':>8} {'vs fp32':>9}")
        for name, r in results.items():
            say(f"{name:<10} {r['ppl']:>8.3f} {100 * r['vs_fp32']:>+8.1f}%")
        say(f"group size {group}; AWQ calibration: {manifest['calibration']}; "
            f"quantized in {manifest['timing']['quantize_s']} s; peak RSS {summary['peak_rss_mb']:.0f} MB")
    return 0
