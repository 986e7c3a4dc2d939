"""Decode and prefill speed against the machine's own limit: bytes read per token, GB/s and share of bandwidth.

For each engine variant (weights × KV cache type × path): prefill tokens/s, decode tokens/s at each requested
depth, the bytes a decode token reads (weights + the KV cache actually attended), the GB/s that implies and its
share of the machine's read bandwidth. The bandwidth is measured between the decode runs (probe, decode, probe,
...: this host's swung 33-58 GB/s from minute to minute, so a probe at the start and end of a run set each run
beside a bandwidth it did not have), each run's share against the mean of the two probes around it, and the
median share reported; the probe keeps the better of torch's sum and the native library's streaming read.
Optional: the same decode with N busy-loop processes beside it (`--background-load`), and peak RSS at a long
context per cache type (each in its own process, since peak RSS only grows).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .harness import peak_memory, peer_env, reset_peak_rss, rss_since_reset
from .random_weights import RANDOM_SHAPES

PROMPT = ("Write a detailed, friendly explanation of how rainbows form, covering refraction, reflection "
          "and dispersion of sunlight in water droplets, and why the colours always appear in the same order.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model ref (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--quant", default="awq", help="comma-separated weights to measure: awq (INT4, default), gguf "
                   "(a .gguf file's own 4-bit weights), none")
    p.add_argument("--kv-cache", default="auto",
                   help="comma-separated KV cache types: auto (the engine's default), fp, bf16, int8, k8v4")
    p.add_argument("--path", default="native",
                   help="comma-separated CPU paths: native (the default step), torch (the PyTorch fallback)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prefill-tokens", type=int, default=512, help="tokens in the prefill measurement")
    p.add_argument("--depths", default="0",
                   help="comma-separated context depths to decode at (0 = a short chat prompt), e.g. 0,1900,8000")
    p.add_argument("--repeats", type=int, default=3, help="median of this many runs")
    p.add_argument("--background-load", type=int, default=0, metavar="N",
                   help="also decode with N busy-loop processes running, and report the ratio to quiet")
    p.add_argument("--memory-at", type=int, default=0, metavar="TOKENS",
                   help="peak RSS with this many tokens of context, per cache type (one process each)")
    p.add_argument("--device", default=None)
    p.add_argument("--random", choices=sorted(RANDOM_SHAPES), default=None, metavar="SHAPE",
                   help="random weights of this shape instead of --model: " + ", ".join(sorted(RANDOM_SHAPES)) +
                        " (a bf16 checkpoint written once into the cache, seed 0, and its INT4 rounding; with "
                        "--llama-cpp also its Q4_0 and Q4_K_M GGUFs)")
    p.add_argument("--threads", type=int, default=None, help="threads (default: automatic)")
    p.add_argument("--llama-cpp", default=None, metavar="SCRIPT",
                   help="also run llama.cpp in the same run and print its figures and Parley's ratio to them: the "
                        "peer script (`SCRIPT bench`, e.g. scripts/llama_cpp.sh) on the embedded model's "
                        "weights; with a .gguf --model, llama-bench on that same file (the script's build, or "
                        "--llama-bench); with --random, llama-bench on Q4_0 and Q4_K_M GGUFs that llama-quantize "
                        "(beside llama-bench) makes from the same checkpoint")
    p.add_argument("--llama-bench", default=None, metavar="PATH",
                   help="llama.cpp's llama-bench binary for a .gguf --model (default: the peer script's build, "
                        "$PEERS/llama.cpp/build/bin/llama-bench, PEERS defaulting to ~/.cache/parley-peers)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def probe_mb(cache_dir: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """The probe's buffer in MB: 32 times the largest cache (1 GB on a 32 MB L3), 1 to 4 GB (see BandwidthProbe)."""
    units, largest_kb = {"K": 1, "M": 1024}, 0
    for index in Path(cache_dir).glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
            kb = int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text) // 1024
        except (OSError, ValueError):
            continue
        largest_kb = max(largest_kb, kb)
    return min(4096, max(1024, 32 * largest_kb // 1024))


class BandwidthProbe:
    """The machine's read bandwidth now: the best of `repeats` streaming reads of a buffer far past the caches,
    by the better of two readers (torch's multi-threaded sum, and with the native step attached its library's
    read on the step's threads, `parley_read_gbs`): a probe that under-reads makes a step's share read high.

    Why 32 times the L3: an AMD L3 keeps part of a buffer swept again and again, so a buffer a few times the L3
    reads partly from it. On a 2-core EPYC (32 MB L3), eight alternated rounds in one process: the native read of
    256 MB 77-90 GB/s (median ~80), of 1 GB 74-78, of 4 GB 74-76; a decode step's gigabytes of weights never
    come back to the L3 between tokens, so DRAM is what it should be set beside."""

    def __init__(self, engine=None, mb: int | None = None, repeats: int = 3) -> None:
        import torch

        native = getattr(engine, "native", None)
        self.lib = native.lib if native is not None and hasattr(native.lib, "parley_read_gbs") else None
        self.buf = torch.ones((mb or probe_mb()) * 2**20, dtype=torch.uint8)  # touched: its pages are in memory
        self.repeats = repeats
        self.kind = "max(torch sum, native read)" if self.lib is not None else "torch sum"

    def __call__(self) -> float:
        import torch

        x, best = self.buf.view(torch.float32), 0.0
        for _ in range(self.repeats):
            t = time.perf_counter()
            x.sum()
            best = max(best, self.buf.numel() / (time.perf_counter() - t) / 1e9)
        if self.lib is not None:
            best = max(best, float(self.lib.parley_read_gbs(self.buf.data_ptr(), self.buf.numel(), self.repeats, 0)))
        return best


def read_bandwidth_gbs(mb: int | None = None, repeats: int = 3) -> float:
    """The machine's read bandwidth as a multi-threaded torch sum (no engine at hand)."""
    return BandwidthProbe(None, mb, repeats)()


def weight_bytes_per_token(engine) -> int:
    """Bytes of weights a decode step reads: every decoder and head weight, plus one embedding row."""
    model = engine.model
    if engine.native is not None:
        return engine.native.weight_bytes
    total = 0
    seen: set[int] = set()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if name.startswith("embed_tokens") or id(t) in seen or name == "inv_freq":
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    head = model.lm_head
    prepared = getattr(head, "prepared", None)
    for attr in ("weight", "scales"):
        t = getattr(prepared, attr, None)
        if t is not None:
            total += t.numel() * t.element_size()
    return total + model.config.dim * 4


def _busy() -> None:
    while True:
        pass


class BackgroundLoad:
    """N processes spinning on a core each, for as long as the `with` block runs."""

    def __init__(self, n: int) -> None:
        self.n, self.procs = n, []

    def __enter__(self) -> BackgroundLoad:
        ctx = multiprocessing.get_context("spawn")
        self.procs = [ctx.Process(target=_busy, daemon=True) for _ in range(self.n)]
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.join()


def decode_runs(engine, prompt_ids: list[int], depth: int, new_tokens: int, repeats: int,
                probe: BandwidthProbe | None = None) -> list[tuple[float, float | None]]:
    """Greedy decode with the engine's own verbs (no speculation, no stop tokens) after `depth` tokens: per run,
    tokens/s and (with `probe`) the mean of the bandwidths read just before and just after it."""
    ctx = (prompt_ids * (depth // max(1, len(prompt_ids)) + 1))[:depth] if depth else prompt_ids
    runs: list[tuple[float, float | None]] = []
    for r in range(repeats + 1):  # the first run warms up
        engine.reset_cache()
        engine.prefill(ctx[:-1])
        tok = ctx[-1]
        before = probe() if probe is not None and r else None
        t = time.perf_counter()
        for _ in range(new_tokens):
            logits = engine.forward([tok])
            engine.commit([tok])
            tok = int(logits[-1].argmax())
        rate = new_tokens / (time.perf_counter() - t)
        if r:
            runs.append((rate, None if before is None else (before + probe()) / 2))
    return runs


def decode_rate(engine, prompt_ids: list[int], depth: int, new_tokens: int, repeats: int) -> float:
    """Median tokens/s of `decode_runs`."""
    return _median([rate for rate, _ in decode_runs(engine, prompt_ids, depth, new_tokens, repeats)])


def prefill_rate(engine, prompt_ids: list[int], tokens: int, repeats: int) -> float:
    filler = (prompt_ids * (tokens // len(prompt_ids) + 1))[:tokens]
    rates = []
    for _ in range(repeats + 1):
        engine.reset_cache()
        t = time.perf_counter()
        engine.prefill(filler)
        rates.append(tokens / (time.perf_counter() - t))
    return _median(rates[1:])


def _log(message: str) -> None:
    print(f"[bench decode] {message}", file=sys.stderr, flush=True)


def load_engine(args: argparse.Namespace, quant: str, kv: str, path: str):
    if args.random:
        from .random_weights import random_engine

        return random_engine(args.random, quant, args.device, kv_cache=kv, native=path != "torch", log=_log)
    from ..app.engine_from_args import engine_from_args  # app: the model flags' one path to an engine, as users load

    return engine_from_args(args, quant=quant, kv_cache=kv, native=path != "torch", draft=None, compile=None)


def memory_at(args: argparse.Namespace, quant: str, kv: str, tokens: int) -> dict:
    """Peak RSS of a fresh process whose `kv` cache ends holding `tokens` of context (a prompt of tokens - 4,
    then 4 decoded tokens)."""
    cmd = [sys.executable, "-m", "parley.app.cli", "bench", "decode", "--quant", quant, "--kv-cache", kv,
           "--depths", str(max(1, tokens - 4)), "--new-tokens", "4", "--repeats", "1", "--prefill-tokens", "16",
           "--json"]
    if args.model:
        cmd += ["--model", args.model]
    r = subprocess.run(cmd, capture_output=True, text=True)
    try:
        out = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (r.stderr or r.stdout).strip()[-300:]}
    v = next(iter(out["engines"].values()))
    in_use = {k: v[k] for k in ("peak_rss_in_use_mb", "rss_mb") if k in v}
    return {"peak_rss_mb": out["peak_rss_mb"], **in_use, "kv_cache_mb": v.get("kv_cache_mb"), **(
        {"peak_gpu_mb": out["peak_gpu_mb"]} if "peak_gpu_mb" in out else {})}


def _run_peer(cmd: list[str], env: dict[str, str] | None = None) -> tuple[list[dict], str] | dict:
    """`cmd`'s stdout JSON lines and its stderr, or {"error": ...}; killed with all it started after 30 min."""
    try:  # its own process group: a timeout ends the llama-bench it started too, not only the script
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=peer_env(env), start_new_session=True)
    except OSError as e:
        return {"error": f"{cmd[0]}: {e}"}
    try:
        out, err = proc.communicate(timeout=1800)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"error": f"{' '.join(cmd[:2])} took over 1800 s (a busy machine?)"}
    rows = []
    for line in out.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows or {"error": f"{' '.join(cmd[:2])} printed no figures (rc={proc.returncode}): {err.strip()[-300:]}"}


def llama_cpp_figures(script: str, threads: int) -> list[dict] | dict:
    """The peer script's JSON lines (engine, type, what, tokens, depth, tok_s), run with the same thread count."""
    return _run_peer([script, "bench"], {"THREADS": str(threads)})


def llama_bench_path(script: str | None, binary: str | None) -> str:
    """llama-bench: `binary`, `script` itself when it is one, else where the peer script builds it."""
    if binary:
        return binary
    if script and os.path.basename(script) == "llama-bench":
        return script
    peers = os.path.expanduser(os.environ.get("PEERS", "~/.cache/parley-peers"))
    return os.path.join(peers, "llama.cpp", "build", "bin", "llama-bench")


def llama_bench_figures(binary: str, model: str, threads: int, prefill: int, new_tokens: int,
                        depths: list[int], repeats: int) -> list[dict] | dict:
    """llama-bench on `model` (the GGUF Parley loads): prefill and decode as this bench measures them, in the
    peer script's rows (engine, type, what, tokens, depth, threads, tok_s) plus the file."""
    if not os.path.isfile(binary):
        return {"error": f"{binary}: no llama-bench there; build it (scripts/llama_cpp.sh build) or pass "
                         "--llama-bench PATH"}
    base = [binary, "-m", model, "-t", str(threads), "-r", str(repeats), "-o", "jsonl"]
    runs = [["-p", str(prefill), "-n", str(new_tokens)]] + [
        ["-p", "0", "-n", str(new_tokens), "-d", str(d)] for d in depths if d > 0]
    rows: list[dict] = []
    for extra in runs:
        got = _run_peer(base + extra)
        if isinstance(got, dict):
            return got
        for r in got:
            what = "prefill" if r["n_prompt"] else ("decode_at_depth" if r.get("n_depth") else "decode")
            rows.append({"engine": "llama.cpp", "type": r["model_type"], "what": what,
                         "tokens": r["n_prompt"] or r["n_gen"], "depth": r.get("n_depth", 0),
                         "threads": r["n_threads"], "tok_s": round(r["avg_ts"], 1), "model_file": model})
    return rows


def random_llama_cpp_files(args: argparse.Namespace, threads: int) -> dict:
    """{type: GGUF} of the random shape for llama.cpp (llama-quantize sits beside llama-bench), or {"error": ...}."""
    from .random_weights import llama_cpp_files

    bench = llama_bench_path(args.llama_cpp, args.llama_bench)
    quantize = os.path.join(os.path.dirname(bench), "llama-quantize")
    if not os.path.isfile(quantize):
        return {"error": f"{quantize}: no llama-quantize beside llama-bench; build llama.cpp "
                         "(../shared/peers/llama_cpp.sh build) or pass --llama-bench PATH of a full build"}
    return llama_cpp_files(args.random, quantize, log=_log, threads=threads)


def random_llama_cpp_figures(args: argparse.Namespace, files: dict, threads: int, depths: list[int]) -> list | dict:
    """llama-bench on each GGUF of the random shape, its rows one list (each row's `type` names the file's)."""
    if "error" in files:
        return files
    bench = llama_bench_path(args.llama_cpp, args.llama_bench)
    rows: list[dict] = []
    for path in files.values():
        got = llama_bench_figures(bench, str(path), threads, args.prefill_tokens, args.new_tokens, depths,
                                  args.repeats)
        if isinstance(got, dict):
            return got
        rows += got
    return rows


def _gguf_file(model: str | None) -> str | None:
    """--model's path when it is a GGUF file (llama.cpp then benches that very file)."""
    if model and model.lower().endswith(".gguf") and os.path.isfile(os.path.expanduser(model)):
        return os.path.abspath(os.path.expanduser(model))
    return None


def peer_ratios(engine: dict, peers: list[dict]) -> list[dict]:
    """Parley's figure over each llama.cpp figure of the same kind (prefill, decode, decode at the nearest depth)."""
    out = []
    for p in peers:
        if p["what"] == "prefill":
            ours = engine.get("prefill_tok_s")
        else:
            want = p.get("depth", 0)
            d = min(engine.get("decode", []), key=lambda d: abs(d["depth"] - want), default=None)
            ours = d["tok_s"] if d and (d["depth"] > 0) == (want > 0) else None
        if ours:
            out.append({**p, "parley_tok_s": ours, "parley_vs_peer": round(ours / p["tok_s"], 2)})
    return out


def run(args: argparse.Namespace) -> int:
    from ..engine.threads import configure_threads

    threads = configure_threads(args.threads)
    depths = [int(d) for d in args.depths.split(",") if d.strip()]
    probed: list[float] = []  # every bandwidth of the run: its median is the run's `read_bandwidth_gbs`
    results: dict = {"model": None, "threads": threads, "new_tokens": args.new_tokens,
                     "prefill_tokens": args.prefill_tokens, "read_bandwidth_gbs": None, "engines": {}}
    want_peers = bool(args.llama_cpp or args.llama_bench)
    # llama.cpp's files first, so its runs follow Parley's closely on a machine whose speed drifts
    peer_files = random_llama_cpp_files(args, threads) if args.random and want_peers else None
    for quant in [q.strip() for q in args.quant.split(",") if q.strip()]:
        for path in [p.strip() for p in args.path.split(",") if p.strip()]:
            for kv in [k.strip() for k in args.kv_cache.split(",") if k.strip()]:
                name = f"{quant}/{path}/kv={kv}"
                try:
                    t = time.perf_counter()
                    engine = load_engine(args, quant, kv, path)
                    load_s = time.perf_counter() - t
                except Exception as e:  # report, keep measuring the rest
                    results["engines"][name] = {"error": f"{type(e).__name__}: {e}"}
                    continue
                results["model"] = engine.model_name
                peak_window = reset_peak_rss()  # what holding and using the context costs, not loading
                ids = engine.tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
                wbytes = weight_bytes_per_token(engine)
                kv_pos = engine.target.cache.bytes_per_position()
                r: dict = {"path": engine.step_kind,
                           "quantization": engine.quantization, "kv_cache": engine.kv_cache,
                           "load_s": round(load_s, 1), "weight_mb_per_token": round(wbytes / 1e6, 1),
                           "kv_cache_mb": round(kv_pos * engine.target.cache.max_len / 1e6, 1)}
                if args.prefill_tokens:
                    r["prefill_tok_s"] = round(prefill_rate(engine, ids, args.prefill_tokens, args.repeats), 1)
                r["decode"] = []
                probe = BandwidthProbe(engine)
                r["bandwidth_probe"] = probe.kind
                for depth in depths:
                    runs = decode_runs(engine, ids, depth, args.new_tokens, args.repeats, probe)
                    rate = _median([rate for rate, _ in runs])
                    ctx = (depth or len(ids)) + args.new_tokens // 2  # mean positions attended per token
                    per_token = wbytes + kv_pos * ctx
                    shares = [100 * per_token * rt / (bw * 1e9) for rt, bw in runs]  # each run against its own probes
                    probed.extend(bw for _, bw in runs)
                    r["decode"].append({
                        "depth": depth, "tok_s": round(rate, 1), "kv_mb_per_token": round(kv_pos * ctx / 1e6, 2),
                        "mb_per_token": round(per_token / 1e6, 1), "gb_s": round(per_token * rate / 1e9, 1),
                        "read_bandwidth_gbs": round(_median([bw for _, bw in runs]), 1),
                        "pct_of_bandwidth": round(_median(shares), 1),
                        "pct_of_bandwidth_runs": [round(x, 1) for x in shares]})
                del probe
                if args.background_load:
                    with BackgroundLoad(args.background_load):
                        busy = decode_rate(engine, ids, depths[0], args.new_tokens, args.repeats)
                    r["busy"] = {"processes": args.background_load, "tok_s": round(busy, 1),
                                 "vs_quiet": round(busy / r["decode"][0]["tok_s"], 2)}
                if peak_window:
                    r.update(rss_since_reset())
                results["engines"][name] = r
                del engine
    results["read_bandwidth_gbs"] = round(_median(probed) if probed else read_bandwidth_gbs(), 1)
    if want_peers:
        gguf = _gguf_file(args.model)
        if peer_files is not None:
            peers = random_llama_cpp_figures(args, peer_files, threads, depths)
        elif gguf:  # the same file Parley loaded, not the script's re-quantized copies of the embedded model
            peers = llama_bench_figures(llama_bench_path(args.llama_cpp, args.llama_bench), gguf, threads,
                                        args.prefill_tokens, args.new_tokens, depths, args.repeats)
        elif args.llama_cpp and args.model is None:
            peers = llama_cpp_figures(args.llama_cpp, threads)
        else:
            peers = {"error": f"--model {args.model} is no .gguf file: llama.cpp is compared on the same file only"}
        results["llama_cpp"] = peers
        if isinstance(peers, list):
            for r in results["engines"].values():
                if "error" not in r:
                    r["vs_llama_cpp"] = peer_ratios(r, peers)
    if args.memory_at:
        results["memory_at"] = {"tokens": args.memory_at, "by_cache": {}}
        for kv in ("fp", "bf16", "int8", "k8v4"):
            results["memory_at"]["by_cache"][kv] = memory_at(args, args.quant.split(",")[0], kv, args.memory_at)
    results.update(peak_memory())

    if args.json:
        print(json.dumps(results))
        return 0
    print(f"model: {results['model']}  threads: {threads}  read bandwidth {results['read_bandwidth_gbs']} GB/s "
          f"(median of the probes between decode runs)  "
          f"(decode {args.new_tokens} tokens, median of {args.repeats})")
    for name, r in results["engines"].items():
        if "error" in r:
            print(f"  {name:<24} unavailable: {r['error']}")
            continue
        pre = f"prefill {r['prefill_tok_s']:7.1f} tok/s  " if "prefill_tok_s" in r else ""
        print(f"  {name:<24} [{r['path']}] {pre}weights {r['weight_mb_per_token']} MB/token (load {r['load_s']} s)")
        for d in r["decode"]:
            print(f"      decode at depth {d['depth']:>5}: {d['tok_s']:7.1f} tok/s  {d['mb_per_token']:6.1f} MB/token "
                  f"(KV {d['kv_mb_per_token']})  {d['gb_s']:5.1f} GB/s = {d['pct_of_bandwidth']}% of bandwidth "
                  f"(median of each run against the {d['read_bandwidth_gbs']} GB/s probed around it; runs: "
                  f"{', '.join(f'{x}%' for x in d['pct_of_bandwidth_runs'])})")
        for v in r.get("vs_llama_cpp", []):
            at = f" at depth {v['depth']}" if v.get("depth") else ""
            print(f"      vs llama.cpp {v['type']} {v['what']}{at}: {v['tok_s']} tok/s -> Parley "
                  f"{v['parley_vs_peer']}x")
        if "busy" in r:
            b = r["busy"]
            print(f"      with {b['processes']} busy process(es): {b['tok_s']} tok/s = {b['vs_quiet']}x quiet")
    if isinstance(results.get("llama_cpp"), dict):
        print(f"  llama.cpp: {results['llama_cpp']['error']}")
    elif results.get("llama_cpp") and "model_file" in results["llama_cpp"][0]:
        files = sorted({r["model_file"] for r in results["llama_cpp"]})
        same = "the same checkpoint's" if args.random else "the same file,"
        print(f"  llama.cpp: llama-bench on {same} {', '.join(files)}")
    for kv, m in results.get("memory_at", {}).get("by_cache", {}).items():
        in_use = f"peak RSS after loading {m['peak_rss_in_use_mb']} MB, " if "peak_rss_in_use_mb" in m else ""
        figures = (f"{in_use}peak RSS {m['peak_rss_mb']} MB (loading included), cache {m['kv_cache_mb']} MB"
                   if "error" not in m else m["error"])
        print(f"  at {args.memory_at} tokens, kv={kv}: {figures}")
    print(f"  peak RSS {results['peak_rss_mb']} MB" + (f", peak GPU {results['peak_gpu_mb']} MB"
                                                        if "peak_gpu_mb" in results else ""))
    return 0
