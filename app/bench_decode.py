"""Prefill and decode tokens/s of the engine (fp32 and INT4), next to transformers' generate, in one run."""

from __future__ import annotations

import argparse
import json
import time

import torch

from .bench_harness import peak_memory

PROMPT = ("Write a detailed, friendly explanation of how rainbows form, covering refraction, reflection "
          "and dispersion of sunlight in water droplets, and why the colours always appear in the same order.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model ref (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--quant", default="none,awq,awq+compile",
                   help="comma-separated engine variants to measure: none (fp32/bf16 weights), awq (INT4); "
                        "+compile adds torch.compile of the decode step")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prefill-tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3, help="median of this many runs")
    p.add_argument("--no-transformers", action="store_true", help="skip the transformers reference")
    p.add_argument("--device", default=None)
    p.add_argument("--random", choices=sorted(RANDOM_SHAPES), default=None,
                   help="random weights of this shape instead of --model (GPU figures for a 7B-shaped model)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


# Random weights of real shapes: GPU speed is measured on these (no real 7B model can be brought here).
RANDOM_SHAPES = {
    "7b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, intermediate_size=11008),
    "small": dict(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=512),  # for tests
}


def random_engine(shape: str, quant: str, device: str | None, compile: bool):
    """An engine over random weights of a named shape, with the embedded model's tokenizer. `awq` here is
    round-to-nearest INT4 of the random weights: the same layout, kernels and bytes as a real AWQ model."""
    from ..engine.engine import Engine, default_device
    from ..models.config import ModelConfig
    from ..models.quantize.head import FastHead
    from ..models.quantize.int4_linear import Int4Linear, decoder_linears
    from ..models.resolve import resolve
    from ..models.tokenizer import load_tokenizer
    from ..models.transformer import Transformer
    from ..models.transposed_linear import transpose_linears

    dev = torch.device(device) if device else default_device()
    tokenizer = load_tokenizer(resolve(None))
    config = ModelConfig(arch="llama", vocab_size=tokenizer.vocab_size, max_seq_len=4096, **RANDOM_SHAPES[shape])
    with torch.device(dev):
        model = Transformer(config).to(torch.bfloat16 if dev.type == "cuda" else torch.float32).eval()
    if quant == "awq":
        for parent, name, linear in decoder_linears(model):
            setattr(parent, name, Int4Linear.from_linear(linear, 128))
        model.lm_head = FastHead(model.lm_head.weight)
    elif dev.type == "cpu":
        transpose_linears(model)
    return Engine(model, tokenizer, name=f"random-{shape}", quantization="rtn-int4" if quant == "awq" else "none",
                  context_window=4096, compile=compile)


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def measure_engine(engine, prompt_ids: list[int], prefill_tokens: int, new_tokens: int, repeats: int) -> dict:
    """Greedy decode with the engine's own verbs: no speculation, no stop tokens, so every run
    decodes exactly `new_tokens` tokens."""
    filler = (prompt_ids * (prefill_tokens // len(prompt_ids) + 1))[:prefill_tokens]
    prefill, decode = [], []
    for _ in range(repeats + 1):  # the first run warms up (allocations, compilation)
        engine.reset_cache()
        t = time.perf_counter()
        engine.prefill(filler)
        prefill.append(prefill_tokens / (time.perf_counter() - t))

        engine.reset_cache()
        engine.prefill(prompt_ids[:-1])
        tok = prompt_ids[-1]
        t = time.perf_counter()
        for _ in range(new_tokens):
            logits = engine.forward([tok])
            engine.commit([tok])
            tok = int(logits[-1].argmax())
        decode.append(new_tokens / (time.perf_counter() - t))
    return {"prefill_tok_s": _median(prefill[1:]), "decode_tok_s": _median(decode[1:])}


def measure_transformers(files, prompt_ids: list[int], new_tokens: int, repeats: int) -> dict | None:
    try:
        import transformers
    except ImportError:
        return None
    path = files.path
    kw = {"gguf_file": path.name} if files.kind == "gguf" else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent if files.kind == "gguf" else path), dtype=torch.float32, **kw).eval()
    ids = torch.tensor([prompt_ids])
    rates = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            t = time.perf_counter()
            model.generate(ids, max_new_tokens=1, do_sample=False)
            one = time.perf_counter() - t
            t = time.perf_counter()
            model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
            rates.append((new_tokens - 1) / (time.perf_counter() - t - one))
    return {"decode_tok_s": _median(rates[1:])}


def run(args: argparse.Namespace) -> int:
    from ..engine.engine import Engine
    from ..models.resolve import resolve

    if args.threads:
        torch.set_num_threads(args.threads)
    results: dict = {"model": None, "threads": torch.get_num_threads(), "new_tokens": args.new_tokens,
                     "prefill_tokens": args.prefill_tokens, "engines": {}}
    base = None
    for variant in [q.strip() for q in args.quant.split(",") if q.strip()]:
        quant, _, extra = variant.partition("+")
        try:
            t = time.perf_counter()
            if args.random:
                engine = random_engine(args.random, quant, args.device, extra == "compile")
            else:
                engine = Engine.load(args.model, quant=quant, device=args.device, compile=extra == "compile")
            if extra == "compile":  # compile now, outside the timed runs, for one token and for a few
                engine.prefill([0, 1])
                engine.forward([2])
                engine.forward([2, 3])
            load_s = time.perf_counter() - t
        except Exception as e:  # e.g. INT4 path not available: report, keep measuring the rest
            results["engines"][variant] = {"error": f"{type(e).__name__}: {e}"}
            continue
        results["model"] = engine.model_name
        ids = engine.tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
        r = measure_engine(engine, ids, args.prefill_tokens, args.new_tokens, args.repeats)
        r["dtype"] = str(engine.model.norm.weight.dtype).removeprefix("torch.")
        r["quantization"] = engine.quantization
        r["load_s"] = round(load_s, 1)
        results["engines"][variant] = r
        base = base or r
        del engine
    if not args.no_transformers and not args.random:
        files = resolve(args.model)
        ids_engine = None
        try:
            from ..models.tokenizer import load_tokenizer

            ids_engine = load_tokenizer(files).encode_chat([{"role": "user", "content": PROMPT}])
            ref = measure_transformers(files, ids_engine, args.new_tokens, args.repeats)
        except Exception as e:
            ref = {"error": f"{type(e).__name__}: {e}"}
        if ref is not None:
            results["transformers_fp32"] = ref
    if base and "decode_tok_s" in results.get("transformers_fp32", {}):
        for r in results["engines"].values():
            if "decode_tok_s" in r:
                r["decode_vs_transformers"] = round(r["decode_tok_s"] / results["transformers_fp32"]["decode_tok_s"], 2)
    fp = results["engines"].get("none", {})
    for r in results["engines"].values():
        if "decode_tok_s" in r and "decode_tok_s" in fp:
            r["decode_vs_fp"] = round(r["decode_tok_s"] / fp["decode_tok_s"], 2)
    results.update(peak_memory())

    if args.json:
        print(json.dumps(results))
        return 0
    print(f"model: {results['model']}  threads: {results['threads']}  "
          f"prefill {args.prefill_tokens} tokens, decode {args.new_tokens} tokens (median of {args.repeats})")
    for name, r in results["engines"].items():
        if "error" in r:
            print(f"  parley {name:<12} unavailable: {r['error']}")
            continue
        extra = "".join(f"  {k}={r[k]}x" for k in ("decode_vs_fp", "decode_vs_transformers") if k in r)
        print(f"  parley {name:<12} ({r['dtype']}, {r['quantization']}): prefill {r['prefill_tok_s']:7.1f} tok/s  "
              f"decode {r['decode_tok_s']:6.1f} tok/s{extra}  (load {r['load_s']} s)")
    if "transformers_fp32" in results:
        r = results["transformers_fp32"]
        print("  transformers fp32 generate: " + (f"decode {r['decode_tok_s']:6.1f} tok/s" if "decode_tok_s" in r
                                                 else r["error"]))
    print(f"  peak RSS {results['peak_rss_mb']} MB" + (f", peak GPU {results['peak_gpu_mb']} MB"
                                                        if "peak_gpu_mb" in results else ""))
    return 0
