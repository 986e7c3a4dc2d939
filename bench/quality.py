"""Perplexity on held-out text of the fp32, RTN INT4 and AWQ INT4 models, in one run (what INT4 costs).

The text is `assets/heldout/` (not in the calibration corpus), cut into chunks of --chunk tokens; each
chunk is scored on its second half only, so every scored token has at least half a chunk of context.
The models are loaded by `Engine.load` (on the CPU, in fp32), as the app loads them; RTN is
`rtn_quantize` of the fp32 model, with the same group size as AWQ. By default (`--kernels reference`)
each INT4 linear is dequantized once to the fp32 matrix the reference kernel would multiply by and the
output head is floating point, so the figures measure the quantization alone (and the run takes minutes,
not an hour of per-call dequantization); `--kernels auto` scores the models exactly as the engine runs them.
`--text` scores another text instead (e.g. `/usr/share/common-licenses/GPL-3`, one the project never tuned
on). The INT4 model's bits per weight and its greedy agreement with the fp model on the benches' prompts
(tokens until the first difference) are reported with its perplexity. A .gguf model is also scored on its
own 4-bit weights imported as INT4 (`--quant gguf`, row `gguf_int4`).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

from .harness import add_json_argument, emit, table

HELDOUT_DIR = Path(__file__).resolve().parents[1] / "assets" / "heldout"  # the package root: parley/


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
    parser.add_argument("--method", default="auto",
                        help="the quantization tier to measure (as `parley quantize --method`; default auto)")
    parser.add_argument("--kernels", choices=("reference", "auto"), default="reference",
                        help="reference (default): INT4 weights dequantized exactly once, fp output head -- the "
                             "quantization alone; auto: the models as the engine runs them (its kernels and head)")
    parser.add_argument("--kv-cache", default=None, metavar="TYPES",
                        help="instead: the fp32 model (as the engine runs it) with each comma-separated KV cache "
                             "type (fp, bf16, int8, k8v4); use long chunks, e.g. --chunk 2048")
    parser.add_argument("--agreement-tokens", type=int, default=64,
                        help="greedy tokens of the INT4 model compared with the fp model's on the project's bench "
                             "prompts (0: skip)")
    parser.add_argument("--summary-tokens", type=int, default=128,
                        help="with --kv-cache: greedy tokens of a long-document summary compared with the fp cache's")
    parser.add_argument("--no-awq", action="store_true",
                        help="score only the fp32 model and, for a .gguf, its own 4-bit weights (no AWQ run)")
    add_json_argument(parser)


def perplexity(model, chunks, kv_cache: str = "fp", step=None) -> float:
    """exp(mean NLL) of the second half of every chunk [n, T], each run from an empty cache (every
    position attends to the keys and values as that cache type stores them, as in decoding). `step` runs
    the passes (the engine's native step), else the model's own forward."""
    import torch
    import torch.nn.functional as F

    nll, count = 0.0, 0
    with torch.inference_mode():
        for row in chunks:
            t = row.numel()
            cache = model.new_cache(t, kind=kv_cache)
            cache.window = t
            logits = (step or model)(row[None], torch.arange(t)[None], cache)[0]
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
                dense.weight.copy_(dequantize(lin.qweight, lin.qzeros, lin.scales.float(), lin.group_size,
                                              lin.mins).t())
                if lin.bias is not None:
                    dense.bias.copy_(lin.bias)
            setattr(parent, name, dense)
    return model


def fp_head(model, folder: Path) -> None:
    """Put the exact floating-point output head back where the engine installed its int8 fast head: the
    embedding when tied, else the folder's own `lm_head.weight`."""
    import torch
    from torch import nn

    from ..models.loading import safetensors_weights
    from ..models.quantize.head import FastHead

    if not isinstance(model.lm_head, FastHead):
        return
    weight = model.embed_tokens.weight.to(model.norm.weight.dtype)  # a table held in fp16 widens exactly
    if not model.config.tie_embeddings:
        weight = next(t for name, t in safetensors_weights(folder) if name == "lm_head.weight").to(weight.dtype)
    head = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        head.weight.copy_(weight)
    model.lm_head = head


def run(args: argparse.Namespace) -> int:
    import logging

    import torch

    from ..app.cli import print_progress  # app: the CLI's progress line and `parley quantize`'s --calib values
    from ..app.cli_quantize import _calib
    from ..engine.engine import Engine
    from ..models.quantize.awq import rtn_quantize
    from ..models.quantize.cache import ensure_quantized
    from ..models.quantize.int4_linear import bits_per_weight
    from ..models.quantize.methods import applied_method
    from ..models.resolve import resolve

    logging.basicConfig(level=logging.WARNING, format="parley: %(message)s", stream=sys.stderr)
    say = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    reference = args.kernels == "reference"
    # The AWQ folder first, with this bench's calibration settings; Engine.load then finds it in the cache.
    files = resolve(args.model, progress=print_progress)
    fp = Engine.load(args.model, quant="none", device="cpu")
    tok = fp.tokenizer
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

    if args.kv_cache:
        return kv_cache_quality(args, fp, chunks, files.ref, [t.name for t in texts], say)
    if args.no_awq:
        return fp_and_gguf_quality(args, fp, files, chunks, [t.name for t in texts], reference, say)
    awq_files = ensure_quantized(files, group_size=args.group_size, calib=_calib(args.calib),
                                 n_samples=args.samples, seq_len=args.seq_len, progress=print_progress,
                                 method=args.method)
    manifest = json.loads((awq_files.path / "manifest.json").read_text())
    results: dict[str, dict] = {}
    t0 = time.monotonic()
    results["fp32"] = {"ppl": perplexity(fp.model, chunks, step=fp.native), "seconds": time.monotonic() - t0}
    say(f"fp32        ppl {results['fp32']['ppl']:.3f}")

    rtn = copy.deepcopy(fp.model)
    del fp
    group = rtn_quantize(rtn, args.group_size)
    if reference:
        dequantized(rtn)
    t0 = time.monotonic()
    results["rtn_int4"] = {"ppl": perplexity(rtn, chunks), "seconds": time.monotonic() - t0, "group_size": group}
    del rtn
    say(f"RTN  g{group:<4}  ppl {results['rtn_int4']['ppl']:.3f}")

    t0 = time.monotonic()
    awq_engine = Engine.load(str(awq_files.path), quant="none", device="cpu")  # the folder as the engine runs it
    awq, awq_step = awq_engine.model, awq_engine.native
    load_s = time.monotonic() - t0
    bits = bits_per_weight(awq)  # of the folder's INT4 tensors, before `dequantized` replaces them
    method = applied_method(manifest["settings"])
    if "+hadamard-down" in method and awq.layers[0].mlp.down_diag is None:  # PARLEY_DOWN_HADAMARD=0
        method = method.split("+hadamard-down")[0] + " (standard down_proj: rotation off)"
    head = ("4-bit GPTQ (the engine's head for this model)" if getattr(awq_step, "head_bits", 8) == 4
            else "int8 (the engine's fast head)")
    if reference:  # the modules, not the native step (it holds its own packed copy of the INT4 weights)
        awq_step = None
        dequantized(awq)
        fp_head(awq, awq_files.path)
        head = "fp"
    t0 = time.monotonic()
    results["awq_int4"] = {"ppl": perplexity(awq, chunks, step=awq_step), "seconds": time.monotonic() - t0,
                           "group_size": manifest["settings"]["group_size_used"], "head": head,
                           "method": method,
                           "bits_per_weight": bits, "quantize_s": manifest["timing"]["quantize_s"],
                           "cache_load_s": load_s, "calibration": manifest["calibration"],
                           "folder": str(awq_files.path)}
    results["rtn_int4"]["bits_per_weight"] = bits_per_weight_rtn(group)
    say(f"AWQ  g{group:<4}  ppl {results['awq_int4']['ppl']:.3f}")
    if files.kind == "gguf":  # the file's own 4-bit blocks, imported (--quant gguf), beside Parley's INT4
        results["gguf_int4"] = gguf_quality(args.model, chunks, reference, say)
    if args.agreement_tokens:
        fp_engine = Engine.load(args.model, quant="none", device="cpu")
        int4_engine = Engine.load(str(awq_files.path), quant="none", device="cpu")
        results["awq_int4"]["greedy_agreement"] = greedy_agreement(fp_engine, int4_engine, args.agreement_tokens)
        if "gguf_int4" in results:
            int4_engine = Engine.load(args.model, quant="gguf", device="cpu")
            results["gguf_int4"]["greedy_agreement"] = greedy_agreement(fp_engine, int4_engine, args.agreement_tokens)
        del fp_engine, int4_engine

    base = results["fp32"]["ppl"]
    for r in results.values():
        r["vs_fp32"] = r["ppl"] / base - 1
    summary = {
        "bench": "quality", "model": files.ref, "text": [t.name for t in texts], "chunk": args.chunk,
        "chunks": n, "scored_tokens": n * (args.chunk - args.chunk // 2), "group_size": group,
        "kernels": args.kernels, "results": results,
    }

    def lines(summary: dict) -> list[str]:
        rows = [(name, f"{r['ppl']:.3f}", f"{100 * r['vs_fp32']:+.1f}%",
                 f"{r['bits_per_weight']:.3f}" if "bits_per_weight" in r else "16/32")
                for name, r in results.items()]
        out = ["", *table(("model", "ppl", "vs fp32", "bits/weight (decoder linears)"), rows),
               f"group size {group}; method {results['awq_int4']['method']}; output head: {head}; "
               f"calibration: {manifest['calibration']}; quantized in {manifest['timing']['quantize_s']} s"]
        for name in ("awq_int4", "gguf_int4"):
            if "greedy_agreement" in results.get(name, {}):
                g = results[name]["greedy_agreement"]
                out.append(f"{name}: greedy agreement with fp32 over {g['tokens']} tokens on {len(g['prompts'])} "
                           f"prompts: identical for the first {g['median']} tokens (median), {g['worst']} (worst)")
        if "gguf_int4" in results:
            out.append(f"gguf_int4: {results['gguf_int4']['weights']}")
        return out

    return emit(summary, args.json, lines)


def gguf_quality(model_ref: str | None, chunks, reference: bool, say) -> dict:
    """Perplexity of a GGUF's own 4-bit weights imported as INT4 (--quant gguf): nothing quantized again."""
    from ..engine.engine import Engine
    from ..models.quantize.int4_linear import bits_per_weight

    t0 = time.monotonic()
    engine = Engine.load(model_ref, quant="gguf", device="cpu")
    model, step = engine.model, engine.native
    bits = bits_per_weight(model)
    if reference:
        step = None
        dequantized(model)
    r = {"ppl": perplexity(model, chunks, step=step), "seconds": time.monotonic() - t0, "bits_per_weight": bits,
         "weights": engine.quantization.removeprefix("gguf-int4:")}
    say(f"GGUF {r['weights']}  ppl {r['ppl']:.3f}")
    return r


def fp_and_gguf_quality(args: argparse.Namespace, fp, files, chunks, text: list[str], reference: bool, say) -> int:
    """--no-awq: the fp32 model and (a .gguf) its own 4-bit weights, with their greedy agreement."""
    from ..engine.engine import Engine

    t0 = time.monotonic()
    results = {"fp32": {"ppl": perplexity(fp.model, chunks, step=fp.native), "seconds": time.monotonic() - t0}}
    say(f"fp32        ppl {results['fp32']['ppl']:.3f}")
    if files.kind == "gguf":
        results["gguf_int4"] = gguf_quality(args.model, chunks, reference, say)
        if args.agreement_tokens:
            int4 = Engine.load(args.model, quant="gguf", device="cpu")
            results["gguf_int4"]["greedy_agreement"] = greedy_agreement(fp, int4, args.agreement_tokens)
    for r in results.values():
        r["vs_fp32"] = r["ppl"] / results["fp32"]["ppl"] - 1
    summary = {"bench": "quality", "model": files.ref, "text": text, "chunk": args.chunk, "chunks": len(chunks),
               "scored_tokens": len(chunks) * (args.chunk - args.chunk // 2), "kernels": args.kernels,
               "results": results}

    def lines(summary: dict) -> list[str]:
        rows = [(name, f"{r['ppl']:.3f}", f"{100 * r['vs_fp32']:+.1f}%", r.get("weights", ""))
                for name, r in results.items()]
        out = ["", *table(("model", "ppl", "vs fp32", "weights"), rows)]
        g = results.get("gguf_int4", {}).get("greedy_agreement")
        if g:
            out.append(f"gguf_int4: greedy agreement with fp32 over {g['tokens']} tokens on {len(g['prompts'])} "
                       f"prompts: identical for the first {g['median']} tokens (median), {g['worst']} (worst)")
        return out

    return emit(summary, args.json, lines)


def bits_per_weight_rtn(group: int) -> float:
    """What the RTN model stores per weight: 4 bits + an fp16 scale and a 4-bit zero per group."""
    return 4 + (16 + 4) / group


def greedy(engine, ids: list[int], new_tokens: int) -> list[int]:
    """`new_tokens` greedy tokens after prompt `ids`, one decode step at a time from an empty cache."""
    engine.reset_cache()
    engine.prefill(ids[:-1])
    tok, out = ids[-1], []
    for _ in range(new_tokens):
        logits = engine.forward([tok])
        engine.commit([tok])
        tok = int(logits[-1].argmax())
        out.append(tok)
    return out


def greedy_agreement(fp, int4, new_tokens: int) -> dict:
    """Tokens until the INT4 model's first greedy difference from the fp model, on the benches' chat prompts."""
    import statistics

    from .decode import PROMPT
    from .speculative import CHAT_PROMPT, SUMMARY_PROMPT, document

    prompts = {"decode": PROMPT, "chat": CHAT_PROMPT, "sky": "Why is the sky blue?",
               "summary": SUMMARY_PROMPT + document()[:3000]}
    same = {}
    for name, text in prompts.items():
        ids = fp.tokenizer.encode_chat([{"role": "user", "content": text}])
        ids = ids[-(min(fp.context_window, int4.context_window) - new_tokens - 1):]
        a, b = greedy(fp, ids, new_tokens), greedy(int4, ids, new_tokens)
        same[name] = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), new_tokens)
    return {"tokens": new_tokens, "prompts": same, "median": statistics.median(same.values()),
            "worst": min(same.values())}


def greedy_summary(engine, kind: str, new_tokens: int) -> list[int]:
    """Greedy tokens of a summary of the long test document, the KV cache stored as `kind`."""
    from .speculative import SUMMARY_PROMPT, document

    engine.set_kv_cache(kind)
    ids = engine.tokenizer.encode_chat([{"role": "user", "content": SUMMARY_PROMPT + document()}])
    return greedy(engine, ids[-(engine.context_window - new_tokens - 1):], new_tokens)


def kv_cache_quality(args: argparse.Namespace, fp, chunks, model_ref: str, text: list[str], say) -> int:
    """Perplexity of the fp32 model with each KV cache type, against the fp cache."""
    kinds = [k.strip() for k in args.kv_cache.split(",") if k.strip()]
    results: dict[str, dict] = {}
    for kind in ["fp", *[k for k in kinds if k != "fp"]]:
        t0 = time.monotonic()
        results[kind] = {"ppl": perplexity(fp.model, chunks, kind, step=fp.native), "seconds": time.monotonic() - t0}
        say(f"kv={kind:<5} ppl {results[kind]['ppl']:.4f}")
    for r in results.values():
        r["vs_fp"] = r["ppl"] / results["fp"]["ppl"] - 1
    # Greedy agreement on a summary of a long document (assets/speculative/document.md), against the fp cache.
    summaries = {kind: greedy_summary(fp, kind, args.summary_tokens) for kind in results}
    for kind, r in results.items():
        same = sum(a == b for a, b in zip(summaries[kind], summaries["fp"], strict=True))
        first = next((i for i, (a, b) in enumerate(zip(summaries[kind], summaries["fp"], strict=True)) if a != b),
                     len(summaries["fp"]))
        r["summary_agreement"] = same / len(summaries["fp"])
        r["summary_same_prefix"] = first
    path = "native" if fp.native is not None else "pytorch"
    summary = {"bench": "quality", "mode": "kv_cache", "model": model_ref, "text": text, "chunk": args.chunk,
               "chunks": len(chunks), "scored_tokens": len(chunks) * (args.chunk - args.chunk // 2),
               "weights": "fp32", "path": path, "results": results}

    def lines(summary: dict) -> list[str]:
        rows = [(f"kv={k}", f"{r['ppl']:.4f}", f"{100 * r['vs_fp']:+.2f}%",
                 f"{100 * r['summary_agreement']:.0f}% (first {r['summary_same_prefix']} identical)")
                for k, r in results.items()]
        return ["", *table(("KV cache", "ppl", "vs fp", f"greedy summary vs fp, {args.summary_tokens} tokens"), rows),
                f"fp32 weights, {path} path"]

    return emit(summary, args.json, lines)
