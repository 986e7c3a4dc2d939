"""What a multi-token pass costs against a 1-token pass, and how fast the INT4 products run against the core's peak.

Speculative decoding pays only when verifying T drafted tokens costs little more than decoding one. For each
context depth this times passes of T tokens through the engine's own `forward` (the pass speculation's
verification runs; nothing is committed, so every pass writes the same slots), interleaved in rounds so a
neighbour's burst lands on every T alike, and prints each pass's median time and its ratio to a 1-token pass.
Then the INT4 products of one real layer (q/k/v, o, gate/up, down) on one thread at T = 8, 64, 512 rows: GMAC/s
beside the core's measured AVX-512 VNNI peak (12 independent `vpdpbusd` chains), both in the thread's CPU time,
so that a neighbour taking the core does not count against the kernel; and a 512-token prefill on one thread in
CPU time (`--prefill-tokens`), the load-robust companion of `bench decode`'s wall-clock prefill. `--profile`:
where each thread of a 1- and a T-token pass spends its time, per phase (work, and wait at the phase's barrier),
from a library built with PARLEY_NATIVE_FLAGS=-DPARLEY_PROFILE.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time

from .decode import PROMPT, _median
from .random_weights import RANDOM_SHAPES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model ref (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--quant", default="awq", help="awq (INT4, default) or none")
    p.add_argument("--kv-cache", default="auto", help="auto (the engine's default), fp, bf16, int8, k8v4")
    p.add_argument("--passes", default="1,2,4,8,16", help="comma-separated pass lengths (tokens)")
    p.add_argument("--depths", default="0,2000", help="comma-separated context depths (0 = a short chat prompt)")
    p.add_argument("--rows", default="8,64,512", help="comma-separated rows (tokens) for the products' GMAC/s")
    p.add_argument("--breakdown", type=int, default=8, metavar="T",
                   help="also split a pass of T tokens (and of 1) into products, head and the rest, one thread")
    p.add_argument("--prefill-tokens", type=int, default=512, metavar="N",
                   help="also time a prefill of N tokens on one thread in CPU time (0: skip)")
    p.add_argument("--repeats", type=int, default=15, help="rounds; each figure is the median")
    p.add_argument("--threads", type=int, default=None, help="threads (default: automatic)")
    p.add_argument("--random", choices=sorted(RANDOM_SHAPES), default=None,
                   help="random weights of this shape instead of --model (the tests use `small`)")
    p.add_argument("--profile", action="store_true",
                   help="per-phase work and barrier wait of each thread in a 1- and a --breakdown-token pass; run "
                        "with PARLEY_NATIVE_FLAGS=-DPARLEY_PROFILE (a separate build of the library)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def pass_times(engine, ctx: list[int], passes: list[int], repeats: int) -> dict[int, float]:
    """Median seconds of a T-token pass after `ctx`, for each T (rounds interleave the Ts)."""
    engine.reset_cache()
    engine.prefill(ctx)
    tokens = (ctx * (max(passes) // max(1, len(ctx)) + 1))[: max(passes)]
    times: dict[int, list[float]] = {T: [] for T in passes}
    for r in range(repeats + 1):  # round 0 warms up
        for T in passes:
            t = time.perf_counter()
            engine.forward(tokens[:T])
            if r:
                times[T].append(time.perf_counter() - t)
    return {T: _median(ts) for T, ts in times.items()}


def product_gmacs(engine, rows: list[int], repeats: int) -> dict:
    """One thread's GMAC/s over one layer's INT4 products at each row count, and the VNNI peak."""
    import torch

    from ..kernels import native

    step = engine.native
    if step is None:
        return {"error": "the native step is not attached (PARLEY_NATIVE=0 or no compiler)"}
    lib = step.lib
    layer = step.layers[0]
    lins = [layer.qkv, layer.o, layer.gate_up, layer.down]
    if any(L.kind != native.W_Q4 for L in lins):
        return {"error": "the products are not INT4 (--quant none?)"}
    before = lib.parley_threads(-1)
    lib.parley_threads(1)
    try:
        peak = max(lib.parley_vnni_peak_gmacs(5_000_000) for _ in range(3))
        out: dict = {"vnni_peak_gmacs_per_core": round(peak, 1), "by_rows": []}
        g = torch.Generator().manual_seed(0)
        for M in rows:
            xs = [torch.randn(M, L.K, generator=g) for L in lins]
            ys = [torch.empty(M, L.N) for L in lins]
            macs = sum(M * L.N * L.K for L in lins)
            best = []
            for _ in range(max(3, repeats // 3) + 1):
                t = time.thread_time()  # one thread: the library runs in this one
                for L, x, y in zip(lins, xs, ys, strict=True):
                    lib.parley_linear(ctypes.byref(L), M, x.data_ptr(), y.data_ptr())
                best.append(time.thread_time() - t)
            gm = macs / _median(best[1:]) / 1e9
            out["by_rows"].append({"rows": M, "gmacs_per_core": round(gm, 1),
                                   "pct_of_peak": round(100 * gm / peak, 1) if peak else None})
        return out
    finally:
        lib.parley_threads(before)


def breakdown(engine, ctx: list[int], T: int, repeats: int) -> dict:
    """Where a T-token pass's time goes, on one thread in its CPU time (robust to a busy machine): the whole
    pass, the decoder's INT4 products and the output head at T rows; the rest is attention, norms, rotary,
    activation quantization and the cache writes."""
    import torch

    step = engine.native
    if step is None:
        return {"error": "the native step is not attached"}
    lib, cache = step.lib, engine.target.cache
    before = lib.parley_threads(-1)
    lib.parley_threads(1)
    try:
        engine.reset_cache()
        engine.prefill(ctx)
        ids = torch.tensor([(ctx * (T // len(ctx) + 1))[:T]])
        pos = torch.arange(len(ctx), len(ctx) + T)[None]
        lins = [L for layer in step.layers for L in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        g = torch.Generator().manual_seed(0)
        xs = [torch.randn(T, L.K, generator=g) for L in lins] + [torch.randn(T, step.md.head.K, generator=g)]
        ys = [torch.empty(T, L.N) for L in lins] + [torch.empty(T, step.md.head.N)]
        runs: dict[str, list[float]] = {"pass": [], "products": [], "head": []}
        with torch.inference_mode():
            for r in range(repeats + 1):
                t0 = time.thread_time()
                step(ids, pos, cache)
                t1 = time.thread_time()
                for L, x, y in zip(lins, xs, ys, strict=False):
                    lib.parley_linear(ctypes.byref(L), T, x.data_ptr(), y.data_ptr())
                t2 = time.thread_time()
                lib.parley_linear(ctypes.byref(step.md.head), T, xs[-1].data_ptr(), ys[-1].data_ptr())
                t3 = time.thread_time()
                if r:
                    runs["pass"].append(t1 - t0)
                    runs["products"].append(t2 - t1)
                    runs["head"].append(t3 - t2)
    finally:
        lib.parley_threads(before)
    ms = {k: round(1e3 * _median(v), 3) for k, v in runs.items()}
    ms["rest"] = round(ms["pass"] - ms["products"] - ms["head"], 3)
    return {"tokens": T, **{f"{k}_ms": v for k, v in ms.items()}}


PHASES = ("norm", "qkv", "rope", "attend", "merge", "o", "norm2", "gate_up", "silu", "down", "post", "head_quant",
          "head")  # kernels/cpu/profile.h's PH_* order


def phase_profile(engine, ctx: list[int], T: int, repeats: int) -> dict:
    """Per phase of a T-token pass, each thread's median milliseconds of work and of waiting at the phase's
    barrier (a profile build of the library; its timer is not in the shipped build)."""
    import numpy as np
    import torch

    step = engine.native
    if step is None:
        return {"error": "the native step is not attached"}
    threads = step.lib.parley_threads(-1)
    buf = (ctypes.c_double * (threads * len(PHASES) * 2))()
    if step.lib.parley_profile(buf, threads) != len(PHASES):
        return {"error": "the library has no timer: rerun with PARLEY_NATIVE_FLAGS=-DPARLEY_PROFILE"}
    engine.reset_cache()
    engine.prefill(ctx)
    ids = torch.tensor([(ctx * (T // len(ctx) + 1))[:T]])
    pos = torch.arange(len(ctx), len(ctx) + T)[None]
    runs = []
    with torch.inference_mode():
        for r in range(repeats + 1):
            step(ids, pos, engine.target.cache)
            step.lib.parley_profile(buf, threads)
            if r:
                runs.append(np.frombuffer(buf, dtype=np.float64).reshape(threads, len(PHASES), 2).copy())
    ms = np.median(np.stack(runs), axis=0) * 1e3
    return {"tokens": T, "threads": threads,
            "phases": {name: [[round(float(w), 3), round(float(x), 3)] for w, x in ms[:, i]]
                       for i, name in enumerate(PHASES) if ms[:, i].sum() > 0},
            "work_ms": [round(float(x), 3) for x in ms[:, :, 0].sum(axis=1)],
            "wait_ms": [round(float(x), 3) for x in ms[:, :, 1].sum(axis=1)]}


def prefill_cpu(engine, ids: list[int], tokens: int, repeats: int) -> dict:
    """A prefill of `tokens` tokens on one thread in its CPU time: the products at prefill tiles, attention
    over up to `tokens` keys and the rest, robust to a busy machine (wall-clock prefill is `bench decode`'s)."""
    step = engine.native
    if step is None:
        return {"error": "the native step is not attached"}
    ctx = (ids * (tokens // max(1, len(ids)) + 1))[:tokens]
    lib = step.lib
    before, tuner = lib.parley_threads(-1), engine.target.tuner
    lib.parley_threads(1)
    engine.target.tuner = None  # else it sets its own thread count per pass, and this thread's CPU time is a share
    try:
        times = []
        for r in range(max(2, repeats // 3) + 1):  # round 0 warms up
            engine.reset_cache()
            t = time.thread_time()
            engine.prefill(ctx)
            if r:
                times.append(time.thread_time() - t)
    finally:
        lib.parley_threads(before)
        engine.target.tuner = tuner
    s = _median(times)
    return {"tokens": tokens, "ms": round(1e3 * s, 1), "tokens_per_cpu_second": round(tokens / s, 1)}


def run(args: argparse.Namespace) -> int:
    from ..engine.engine import Engine
    from ..engine.threads import configure_threads

    threads = configure_threads(args.threads)
    passes = sorted({int(t) for t in args.passes.split(",") if t.strip()} | {1})
    depths = [int(d) for d in args.depths.split(",") if d.strip()]
    rows = [int(m) for m in args.rows.split(",") if m.strip()]
    if args.random:
        from .random_weights import random_engine

        engine = random_engine(args.random, args.quant, "cpu", kv_cache=args.kv_cache)
    else:
        engine = Engine.load(args.model, quant=args.quant, kv_cache=None if args.kv_cache == "auto" else args.kv_cache,
                             threads=args.threads)
    ids = engine.tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
    results: dict = {"model": engine.model_name, "quantization": engine.quantization, "kv_cache": engine.kv_cache,
                     "path": engine.step_kind, "threads": threads,
                     "depths": []}
    for depth in depths:
        ctx = (ids * (depth // len(ids) + 1))[:depth] if depth else ids
        ts = pass_times(engine, ctx, passes, args.repeats)
        results["depths"].append({"depth": depth, "context": len(ctx), "passes": [
            {"tokens": T, "ms": round(1e3 * ts[T], 3), "vs_one_token": round(ts[T] / ts[1], 2),
             "ms_per_token": round(1e3 * ts[T] / T, 3)} for T in passes],
            "one_thread_cpu": [breakdown(engine, ctx, T, args.repeats) for T in sorted({1, args.breakdown})]})
        if args.profile:
            results["depths"][-1]["profile"] = [phase_profile(engine, ctx, T, args.repeats)
                                                for T in sorted({1, args.breakdown})]
    results["products"] = product_gmacs(engine, rows, args.repeats)
    if args.prefill_tokens > 0:
        results["prefill_one_thread_cpu"] = prefill_cpu(engine, ids, args.prefill_tokens, args.repeats)

    if args.json:
        print(json.dumps(results))
        return 0
    print(f"model: {results['model']}  {results['quantization']}, kv={results['kv_cache']}, "
          f"{results['path']} step, threads: {threads}  (median of {args.repeats} interleaved rounds)")
    for d in results["depths"]:
        print(f"  after {d['context']} tokens of context:")
        for p in d["passes"]:
            print(f"      {p['tokens']:>3}-token pass: {p['ms']:8.3f} ms = {p['vs_one_token']:5.2f}x a 1-token pass "
                  f"({p['ms_per_token']:.3f} ms a token)")
        for b in d["one_thread_cpu"]:
            if "error" not in b:
                print(f"      one thread, CPU time, {b['tokens']}-token pass {b['pass_ms']} ms: INT4 products "
                      f"{b['products_ms']}, head {b['head_ms']}, the rest (attention, norms...) {b['rest_ms']}")
        for pr in d.get("profile", []):
            if "error" in pr:
                print(f"      profile: {pr['error']}")
                continue
            print(f"      {pr['tokens']}-token pass, {pr['threads']} threads, ms of work / wait at the barrier per "
                  f"thread: total {pr['work_ms']} / {pr['wait_ms']}")
            for name, per in pr["phases"].items():
                print(f"        {name:<10} " + "  ".join(f"{w:6.3f} / {x:6.3f}" for w, x in per))
    pr = results["products"]
    if "error" in pr:
        print(f"  INT4 products: {pr['error']}")
    else:
        print(f"  INT4 products of one layer, one thread (VNNI peak {pr['vnni_peak_gmacs_per_core']} GMAC/s per core):")
        for r in pr["by_rows"]:
            print(f"      {r['rows']:>4} rows: {r['gmacs_per_core']:6.1f} GMAC/s = {r['pct_of_peak']}% of peak")
    pf = results.get("prefill_one_thread_cpu")
    if pf and "error" not in pf:
        print(f"  prefill of {pf['tokens']} tokens, one thread, CPU time: {pf['ms']} ms = "
              f"{pf['tokens_per_cpu_second']} tokens per CPU second")
    return 0
