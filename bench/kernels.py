"""`parley bench kernels`: INT4 matmul speed against dense matmul, on the shapes that matter.

Random weights of real shapes: the embedded SmolLM2-135M layers (and its 49,152-row output head) and a
7B llama's. On CPU every variant of a shape is timed in the same rounds, interleaved, and the figure is the
median over rounds, so a neighbour's load hits all variants alike and the ratios hold even when the
absolute times drift. On CUDA: Triton INT4 against fp16 `torch.matmul`, with achieved bandwidth against
the device's peak, timed inside CUDA graphs so launch overhead does not hide the kernel, over enough
copies of each weight that it cannot sit in L2 between calls.

On a busy shared machine, `--threads 1 --stat min --sample-ms 2` gives ratios that repeat within a few
percent; with 2 threads any op split across both threads now and then waits a scheduler tick (4-12 ms)
for its second thread, and the figures swing by 10x between runs.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from parley import kernels
from parley.kernels.reference import dequantize

# (K, N) = (in_features, out_features)
EMBEDDED_SHAPES = [(576, 576), (576, 192), (576, 1536), (1536, 576)]  # q/o, k/v, gate/up, down
EMBEDDED_HEAD = (576, 49152)
LLAMA_7B_SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096)]

# Peak HBM bandwidth in GB/s by device-name fragment; torch does not report it.
PEAK_GBPS = {"H200": 4800, "H100 SXM": 3350, "H100 PCIe": 2000, "H100": 3350, "A100-SXM4-80GB": 2039,
             "A100 80GB": 1935, "A100": 1555, "L40S": 864, "L4": 300, "A10G": 600, "RTX 4090": 1008}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="auto: CPU figures, plus CUDA figures when a GPU is present")
    parser.add_argument("--group-size", type=int, default=128,
                        help="INT4 group size (a shape whose K it does not divide uses 64, then 32)")
    parser.add_argument("--rounds", type=int, default=9, help="timing rounds; the median is reported")
    parser.add_argument("--stat", choices=["median", "min"], default="median",
                        help="per-call time over rounds: median, or min (the uncontended speed on a busy machine)")
    parser.add_argument("--sample-ms", type=float, default=10.0,
                        help="length of one timing sample; short samples dodge a busy machine's stalls")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--candidates", action="store_true",
                        help="also time the CPU alternatives the fast path was chosen over")
    parser.add_argument("--skip-7b", action="store_true", help="only the embedded model's shapes")
    parser.add_argument("--head-accuracy", action="store_true",
                        help="also score prepare_head on the default model's real hidden states")
    parser.add_argument("--sass", metavar="ARCH", default=None,
                        help="instead of timing: compile every Triton config for ARCH (e.g. sm_90) without a GPU "
                             "and report registers, spills, shared memory and SASS instructions per weight")


def run(args: argparse.Namespace) -> int:
    if args.sass:
        report = sass_report(args.sass)
        if args.json:
            print(json.dumps(report))
        else:
            print_sass_report(report)
        return 0
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    report: dict = {"torch": torch.__version__, "threads": torch.get_num_threads(),
                    "group_size": args.group_size, "stat": args.stat}
    want_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    if args.device in ("auto", "cpu"):
        report["cpu"] = bench_cpu(args)
        report["cpu_head"] = bench_cpu_head(args)
    if args.head_accuracy:
        report["head_accuracy"] = head_accuracy()
    if want_cuda:
        report["cuda_device"] = torch.cuda.get_device_name()
        report["cuda_peak_gbps"] = peak_gbps()
        report["cuda"] = bench_cuda(args)
        report["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    report["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report)
    return 0


def group_for(k: int, wanted: int) -> int:
    return next(g for g in (wanted, 128, 64, 32) if k % g == 0)


def random_awq(k: int, n: int, group_size: int, device: str = "cpu", dtype: torch.dtype = torch.float16):
    """Random AWQ tensors whose dequantized weight has the spread of a real layer (~0.02)."""
    qweight = torch.randint(-(2**31), 2**31 - 1, (k, n // 8), dtype=torch.int32, device=device)
    qzeros = torch.randint(-(2**31), 2**31 - 1, (k // group_size, n // 8), dtype=torch.int32, device=device)
    scales = (torch.rand(k // group_size, n, device=device) * 0.004 + 0.001).to(dtype)
    return qweight, qzeros, scales


def time_interleaved(fns: dict[str, Callable[[], object]], rounds: int, stat: str = "median",
                     min_s: float = 0.01) -> dict[str, float]:
    """Seconds per call of each fn, median (or min) over rounds; every round times all of them in turn.

    Repetitions per sample come from the fastest of a few single calls, so that one call that happened
    to be descheduled (common on a shared 2-core machine) does not shrink every later sample to one call.
    """
    reps = {}
    for name, fn in fns.items():
        fn()
        single = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            single.append(time.perf_counter() - start)
        reps[name] = max(1, int(min_s / max(min(single), 1e-7)))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(reps[name]):
                fn()
            samples[name].append((time.perf_counter() - start) / reps[name])
    pick = min if stat == "min" else statistics.median
    return {name: pick(s) for name, s in samples.items()}


def bench_cpu(args: argparse.Namespace) -> list[dict]:
    """Per shape and row count: the CPU INT4 path against the fp32 dense product."""
    plan = [("embedded", s, (1, 9, 256)) for s in EMBEDDED_SHAPES]
    if not args.skip_7b:
        plan += [("7b", s, (1, 9)) for s in LLAMA_7B_SHAPES]  # a 7B prefill in fp32 takes too long here
    rows = []
    for model, (k, n), ms in plan:
        g = group_for(k, args.group_size)
        awq = random_awq(k, n, g)
        fast = kernels.CpuInt4Linear.from_awq(*awq, g)
        w = dequantize(*awq, g).float().t().contiguous()  # [N, K] as nn.Linear holds it
        extra: dict[str, object] = {}
        if args.candidates:
            extra = {"bf16_dense": w.bfloat16(), "int8_rows": kernels.CpuInt8Linear(w)}
        for m in ms:
            fns = cpu_variants(torch.randn(m, k), w, fast, extra, awq if model == "embedded" else None, g)
            times = time_interleaved(fns, args.rounds, args.stat, args.sample_ms / 1e3)
            row = {"model": model, "K": k, "N": n, "M": m, "group_size": g}
            row.update({f"{name}_us": round(t * 1e6, 1) for name, t in times.items()})
            row.update({f"{name}_speedup": round(times["fp32_dense"] / t, 2)
                        for name, t in times.items() if name != "fp32_dense"})
            rows.append(row)
    return rows


def cpu_variants(x: torch.Tensor, w: torch.Tensor, fast: kernels.CpuInt4Linear, extra: dict,
                 awq: tuple | None, g: int) -> dict[str, Callable[[], object]]:
    """The calls timed for one shape and row count: dense fp32, the INT4 path, and any candidates."""
    xb = x.bfloat16()
    fns: dict[str, Callable[[], object]] = {
        "fp32_dense": lambda: F.linear(x, w),
        "int4": lambda: fast.matmul(x),
        "int4_bf16_act": lambda: fast.matmul(xb),
    }
    if extra:
        fns["bf16_dense"] = lambda: F.linear(xb, extra["bf16_dense"])
        fns["int8_rows_bf16_act"] = lambda: extra["int8_rows"].matmul(xb)
        if awq is not None:  # dequantizing a 7B-sized weight per call would dominate the run
            fns["reference"] = lambda: kernels.reference.int4_linear(x, *awq, g)
    return fns


def bench_cpu_head(args: argparse.Namespace) -> list[dict]:
    """The tied output head: fp32 dense against `prepare_head` at 8, 4 and 16 bits, with its error."""
    k, n = EMBEDDED_HEAD
    w = torch.randn(n, k) * 0.05
    heads = {f"head{bits}": kernels.prepare_head(w, bits) for bits in (8, 4, 16)}
    rows = []
    for m in (1, 9):
        x = torch.randn(m, k)
        times = time_interleaved(head_variants(x, w, heads), args.rounds, args.stat,
                                 args.sample_ms / 1e3)
        exact = F.linear(x, w)
        row = {"K": k, "N": n, "M": m}
        row.update({f"{name}_us": round(t * 1e6, 1) for name, t in times.items()})
        for name, h in heads.items():
            y = h.matmul(x)
            row[f"{name}_speedup"] = round(times["fp32_dense"] / times[name], 2)
            row[f"{name}_max_logit_error"] = round((y - exact).abs().max().item(), 4)
            row[f"{name}_argmax_agrees"] = bool((y.argmax(-1) == exact.argmax(-1)).all())
        rows.append(row)
    return rows


def head_variants(x: torch.Tensor, w: torch.Tensor, heads: dict) -> dict[str, Callable[[], object]]:
    fns: dict[str, Callable[[], object]] = {"fp32_dense": lambda: F.linear(x, w)}
    fns.update({name: (lambda h=h: h.matmul(x)) for name, h in heads.items()})
    return fns


ACCURACY_TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a can of oil and a "
    "cloth for the lens. In winter the storms came in from the west, and ships that had lost their way "
    "looked for the beam sweeping across the water. He kept a logbook of every vessel he saw: its name "
    "when he could read it, the direction it sailed, the weather, and the hour. Years later, historians "
    "used those pages to reconstruct the trade routes of the coast, the arrival of steam engines, and the "
    "slow decline of the fishing fleet. The keeper himself never thought his notes would matter; he wrote "
    "them because the rules said so, and because the nights were long. When the light was automated, the "
    "logbooks were packed into boxes and sent to the county archive, where they stayed untouched for "
    "decades until a student, searching for something else entirely, opened the first box and began to read.")


def head_accuracy() -> dict:
    """prepare_head against the exact fp32 head on the default model's final hidden states.

    Real activations matter here: the error of a weight-only head depends on how close the top logits
    of real text are, which random weights do not reproduce.
    """
    from parley.models.loading import load_model
    from parley.models.resolve import resolve
    from parley.models.tokenizer import load_tokenizer

    files = resolve(None)
    model, tokenizer = load_model(files), load_tokenizer(files)
    ids = torch.tensor([tokenizer.encode(ACCURACY_TEXT)])
    hidden: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda _m, inputs, _out: hidden.append(inputs[0][0]))
    cache = model.new_cache(ids.shape[1])
    with torch.no_grad():
        model(ids, torch.arange(ids.shape[1])[None], cache)
    hook.remove()
    x, weight = hidden[0], model.lm_head.weight.detach()
    exact = F.linear(x, weight)
    targets = ids[0, 1:]
    result: dict = {"model": str(files.path.name), "tokens": ids.shape[1],
                    "fp32_nll": round(F.cross_entropy(exact[:-1], targets).item(), 4)}
    for bits in (8, 4, 16):
        y = kernels.prepare_head(weight, bits).matmul(x)
        log_p, log_q = exact.log_softmax(-1), y.log_softmax(-1)
        result[f"head{bits}"] = {
            "max_logit_error": round((y - exact).abs().max().item(), 4),
            "mean_logit_error": round((y - exact).abs().mean().item(), 4),
            "argmax_agreement": round((y.argmax(-1) == exact.argmax(-1)).float().mean().item(), 4),
            "kl": float(f"{(log_p.exp() * (log_p - log_q)).sum(-1).mean().item():.3g}"),
            "nll": round(F.cross_entropy(y[:-1], targets).item(), 4),
        }
    return result


def peak_gbps() -> float | None:
    name = torch.cuda.get_device_name()
    return next((float(v) for key, v in PEAK_GBPS.items() if key in name), None)


def bench_cuda(args: argparse.Namespace) -> list[dict]:
    """Per shape and row count: Triton INT4 against fp16 torch.matmul, with achieved GB/s."""
    shapes = [("embedded", s) for s in [*EMBEDDED_SHAPES, EMBEDDED_HEAD]]
    shapes += [] if args.skip_7b else [("7b", s) for s in LLAMA_7B_SHAPES]
    rows = []
    for model, (k, n) in shapes:
        g = group_for(k, args.group_size)
        awq = random_awq(k, n, g, device="cuda")
        w = dequantize(*awq, g).half()  # [K, N]
        int4_copies = [kernels.prepare(*(t.clone() for t in awq), g) for _ in range(copies_to_miss_l2(awq))]
        fp16_copies = [w.clone() for _ in range(copies_to_miss_l2([w]))]
        int4_bytes = sum(t.numel() * t.element_size() for t in awq)
        for m in (1, 9, 256):
            x = torch.randn(m, k, device=w.device, dtype=torch.float16)
            row = {"model": model, "K": k, "N": n, "M": m, "group_size": g}
            row.update(cuda_times(x, int4_copies, fp16_copies, int4_bytes, w.numel() * 2))
            rows.append(row)
        del int4_copies, fp16_copies
    return rows


def copies_to_miss_l2(tensors: list[torch.Tensor]) -> int:
    """How many copies of a weight, used in turn, keep it from being served out of L2 (at most 64)."""
    size = sum(t.numel() * t.element_size() for t in tensors)
    l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 64 * 2**20)
    return max(1, min(64, -(-4 * l2 // size)))


def cuda_times(x: torch.Tensor, int4_copies: list, fp16_copies: list[torch.Tensor], int4_bytes: int,
               fp16_bytes: int) -> dict:
    """Per-call times from one CUDA graph that runs every copy once, divided by the copy count."""
    from triton.testing import do_bench_cudagraph

    for fast in int4_copies:
        fast.matmul(x)  # autotune (first copy) outside graph capture
    t_int4 = do_bench_cudagraph(lambda: [fast.matmul(x) for fast in int4_copies]) * 1e-3 / len(int4_copies)
    t_fp16 = do_bench_cudagraph(lambda: [torch.matmul(x, w) for w in fp16_copies]) * 1e-3 / len(fp16_copies)
    io = (x.numel() + x.shape[0] * fp16_copies[0].shape[1]) * 2
    row = {"int4_us": round(t_int4 * 1e6, 2), "fp16_us": round(t_fp16 * 1e6, 2),
           "speedup_vs_fp16": round(t_fp16 / t_int4, 2),
           "int4_gbps": round((int4_bytes + io) / t_int4 / 1e9, 1),
           "fp16_gbps": round((fp16_bytes + io) / t_fp16 / 1e9, 1)}
    peak = peak_gbps()
    if peak:
        row["int4_pct_of_peak"] = round(100 * row["int4_gbps"] / peak, 1)
        row["fp16_pct_of_peak"] = round(100 * row["fp16_gbps"] / peak, 1)
    return row


def print_report(report: dict) -> None:
    print(f"torch {report['torch']}, {report['threads']} threads, INT4 group {report['group_size']},"
          f" CPU times are the {report['stat']} over rounds")
    if "cpu" in report:
        print("\nCPU: INT4 path (torch int4 op, bf16 compute) against fp32 dense, timed in the same rounds")
        print(f"{'model':9} {'K':>6} {'N':>6} {'M':>4}  {'fp32 us':>9} {'int4 us':>9} {'x':>6}"
              f" {'int4 bf16-in us':>16} {'x':>6}")
        for r in report["cpu"]:
            print(f"{r['model']:9} {r['K']:6} {r['N']:6} {r['M']:4}  {r['fp32_dense_us']:9.1f}"
                  f" {r['int4_us']:9.1f} {r['int4_speedup']:6.2f} {r['int4_bf16_act_us']:16.1f}"
                  f" {r['int4_bf16_act_speedup']:6.2f}")
            others = [k[:-3] for k in r if k.endswith("_us") and k[:-3] not in
                      ("fp32_dense", "int4", "int4_bf16_act")]
            if others:
                print("          candidates: " + ", ".join(
                    f"{name} {r[name + '_us']:.1f} us ({r[name + '_speedup']:.2f}x)" for name in others))
        print("\nCPU output head 576 -> 49152: prepare_head against fp32 dense (random weights)")
        for r in report["cpu_head"]:
            print(f"  M={r['M']}: fp32 {r['fp32_dense_us']:.0f} us; " + "; ".join(
                f"{b}-bit {r[f'head{b}_us']:.0f} us ({r[f'head{b}_speedup']:.2f}x, max logit error "
                f"{r[f'head{b}_max_logit_error']}, argmax {'same' if r[f'head{b}_argmax_agrees'] else 'DIFFERS'})"
                for b in (8, 4, 16)))
    if "head_accuracy" in report:
        acc = report["head_accuracy"]
        print(f"\nHead on real hidden states ({acc['model']}, {acc['tokens']} tokens; fp32 NLL {acc['fp32_nll']}):")
        for bits in (8, 4, 16):
            a = acc[f"head{bits}"]
            print(f"  {bits:2}-bit: argmax agrees {100 * a['argmax_agreement']:.1f}%, max |dlogit| "
                  f"{a['max_logit_error']}, mean {a['mean_logit_error']}, KL {a['kl']}, NLL {a['nll']}")
    if "cuda" in report:
        peak = report["cuda_peak_gbps"]
        print(f"\nCUDA {report['cuda_device']} (peak {peak or '?'} GB/s): Triton INT4 against fp16 torch.matmul,"
              " CUDA-graph timing")
        print(f"{'model':9} {'K':>6} {'N':>6} {'M':>4}  {'fp16 us':>9} {'int4 us':>9} {'x':>6}"
              f" {'int4 GB/s':>10} {'% peak':>7}")
        for r in report["cuda"]:
            print(f"{r['model']:9} {r['K']:6} {r['N']:6} {r['M']:4}  {r['fp16_us']:9.2f} {r['int4_us']:9.2f}"
                  f" {r['speedup_vs_fp16']:6.2f} {r['int4_gbps']:10.1f} {r.get('int4_pct_of_peak', '-'):>7}")
        print(f"peak GPU memory {report['peak_gpu_mib']} MiB")
    print(f"peak RSS {report['peak_rss_mib']} MiB")


# --- `--sass ARCH`: what each Triton config compiles to, without a GPU ------------------------------------


def _triton_bin(tool: str) -> str:
    import os

    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)


def compile_kernel(fn, signature: dict, constexprs: dict, arch: int, num_warps: int, num_stages: int):
    """triton.compile for a CUDA arch (e.g. 90) on a machine without a GPU: Triton ships ptxas."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(fn=fn, signature={**signature, **dict.fromkeys(constexprs, "constexpr")}, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def disassemble(cubin: bytes) -> tuple[str, int]:
    """(SASS text, registers per thread) of a cubin, from the nvdisasm and cuobjdump Triton ships."""
    import re
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([_triton_bin("cuobjdump"), "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([_triton_bin("nvdisasm"), "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    return sass, int(re.search(r"REG:(\d+)", usage).group(1))


def inner_loop(sass: str, marker: str | None = "MMA") -> list[str]:
    """The instructions of the longest loop (a backward branch's span) that contains `marker`
    (any loop if None): the kernel's main loop, which the per-weight cost is counted over."""
    import re

    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^(\.L_x_\d+):", line))}
    best: list[str] = []
    for i, line in enumerate(lines):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if m and labels.get(m.group(1), i) < i:
            body = [x for x in lines[labels[m.group(1)]: i + 1] if re.match(r"^\s+/\*[0-9a-f]{4,}\*/", x)]
            if (marker is None or any(marker in x for x in body)) and len(body) > len(best):
                best = body
    return best


def _config_row(name: str, compiled, weights_per_iteration: int | None, num_warps: int,
                marker: str | None = "MMA") -> dict:
    sass, registers = disassemble(compiled.asm["cubin"])
    spills = sum(1 for line in sass.splitlines() if " STL" in line or " LDL" in line)
    loop = inner_loop(sass, marker)
    row = {"name": name, "registers": registers, "spills": spills, "shared_bytes": compiled.metadata.shared,
           "loop_instructions": len(loop)}
    if weights_per_iteration:
        row["sass_per_weight"] = round(len(loop) / (weights_per_iteration / (32 * num_warps)), 2)
    return row


def sass_report(arch: str) -> dict:
    """Every config of the INT4 kernels and the decode-attention kernel, compiled for `arch`."""
    import triton

    from parley.kernels import triton_attention, triton_int4

    cc = int(arch.lower().removeprefix("sm_").rstrip("a"))
    configs = []
    ptr = {"x_ptr": "*{dt}", "qweight_ptr": "*i32", "qzeros_ptr": "*i32", "scales_ptr": "*{dt}", "out_ptr": "*{dt}"}
    for dt in ("fp16", "bf16"):
        base = {k: v.format(dt=dt) for k, v in ptr.items()}
        for gated in (False, True):
            for block_n, block_k, warps, stages in triton_int4.skinny_tiles(gated):
                sig = {**base, "workspace_ptr": "*fp32", "tickets_ptr": "*i32", "M": "i32", "N": "i32",
                       "K": "i32", "stride_xm": "i32", "SPLIT_K": "i32"}
                const = {"GROUP_SIZE": 128, "GATED": gated, "UPCAST": False, "BLOCK_N": block_n, "BLOCK_K": block_k}
                compiled = compile_kernel(triton_int4._int4_skinny_kernel, sig, const, cc, warps, stages)
                name = f"skinny_{dt}_n{block_n}_k{block_k}_w{warps}{'_silu_mul' if gated else ''}"
                configs.append(_config_row(name, compiled, block_n * block_k * (2 if gated else 1), warps))
        for config in triton_int4.GEMM_CONFIGS:
            kw = config.kwargs
            sig = {**base, "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "M_BUCKET": "i32"}
            const = {"GROUP_SIZE": 128, "UPCAST": False, **kw}
            compiled = compile_kernel(triton_int4._int4_gemm_kernel.fn, sig, const, cc, config.num_warps,
                                      config.num_stages)
            name = f"gemm_{dt}_m{kw['BLOCK_M']}_n{kw['BLOCK_N']}_k{kw['BLOCK_K']}_w{config.num_warps}"
            configs.append(_config_row(name, compiled, kw["BLOCK_N"] * kw["BLOCK_K"], config.num_warps))
    for kind, code in (("fp16", 0), ("bf16", 0), ("int8", 1), ("k8v4", 2)):
        cache = {"fp16": "*fp16", "bf16": "*bf16", "int8": "*i8", "k8v4": "*i8"}[kind]
        sig = {"q_ptr": "*fp16", "pos_ptr": "*i32", "part_ptr": "*fp32", "stats_ptr": "*fp32", "k_ptr": cache,
               "v_ptr": "*u8" if kind == "k8v4" else cache, "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32",
               "v_min_ptr": "*fp32", "L": "i32", "sm_scale": "fp32", "SPLITS": "i32"}
        const = {"H": 32, "GROUP": 4, "ROWS": 16, "D": 128, "KIND": code, "CHUNK": triton_attention.CHUNK,
                 "BLOCK_L": triton_attention.BLOCK_L, "UPCAST": False}
        compiled = compile_kernel(triton_attention._decode_attention_kernel, sig, const, cc,
                                  triton_attention.NUM_WARPS, 2)
        configs.append(_config_row(f"decode_attention_{kind}_d128", compiled, None, 4, marker=None))
    sig = {"pos_ptr": "*i32", "part_ptr": "*fp32", "stats_ptr": "*fp32", "out_ptr": "*bf16", "SPLITS": "i32"}
    const = {"H": 32, "D": 128, "CHUNK": triton_attention.CHUNK}
    compiled = compile_kernel(triton_attention._combine_kernel, sig, const, cc, 4, 2)
    configs.append(_config_row("decode_attention_combine_d128", compiled, None, 4, marker=None))
    return {"arch": arch, "triton": triton.__version__, "torch": torch.__version__,
            "note": "sass_per_weight: SASS instructions of the main loop / weights each thread handles per "
                    "iteration", "configs": configs}


def print_sass_report(report: dict) -> None:
    print(f"Triton {report['triton']} for {report['arch']} (compiled offline)")
    print(f"{'config':44} {'regs':>5} {'spills':>6} {'smem B':>7} {'loop':>5} {'SASS/weight':>12}")
    for c in report["configs"]:
        print(f"{c['name']:44} {c['registers']:5} {c['spills']:6} {c['shared_bytes']:7} {c['loop_instructions']:5}"
              f" {c.get('sass_per_weight', '-'):>12}")
