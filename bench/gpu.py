"""Every GPU figure of Parley in one run, printed as one JSON object (progress goes to stderr).

Needs only torch, triton and this repository: random weights, random token ids (a stand-in for a
tokenizer), no model files, no network, no .venv. Sections, each under its own time budget so the whole
run stays within `--budget-s` (default 420 s; scripts/gpu_check.sh runs it under a hard timeout):

  environment       GPU, SMs, torch, Triton, CUDA, driver
  int4_correctness  the INT4 kernels at 7B shapes, bf16 and fp16, M = 1, 2, 5, 9, 16 (and a prefill M),
                    against dequantize-then-matmul; rows bitwise equal for every M <= 16; the fused
                    SiLU*mul epilogue
  split_k_stress    every split-K value launched many times on one input: outputs bitwise identical
  int4_speed        per shape at M = 1: us, GB/s and % of the peak bandwidth (4.8 TB/s on an H200)
  attention         the Triton decode attention per KV cache type at a 7B shape: error, row invariance, us
  sdpa_backends     which SDPA backends accept a decode call with / without the boolean mask, and their us
  decode            a random-weight 7B INT4 stack: eager, torch.compile and CUDA graphs: tok/s, bytes per
                    token, % of the bandwidth limit, kernel launches per step
  batch_invariance  the model's logits for a 5-token verification pass against 5 one-token steps
  load_8b           a random Llama-3.1-8B-shaped bf16 safetensors checkpoint (bench/random_weights.py,
                    written into a temp dir) loaded onto the GPU: seconds, GB/s, peak GPU memory
  quantize_8b       one 8B decoder layer quantized as a first run does (awq_layer with first_run_settings:
                    clipping, GPTQ, refit, rotated down_proj) on 128 x 512 random activations, and round to
                    nearest: seconds per layer and x32 (the model-wide rotation and distillation not included)
  decode_8b         the 8B shape (GQA 32/8, vocab 128,256, untied head) as a random INT4 stack: eager and CUDA
                    graphs tok/s against the HBM bound, peak GPU memory

`--dry` runs the same code on CPU (Triton under TRITON_INTERPRET=1) at toy shapes, so a test can prove
the command's Python works before a GPU ever sees it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable

import torch

PEAK_GBPS = {"H200": 4800, "H100": 3350, "A100": 2039, "L40S": 864, "L4": 300}
SHAPES_7B = [(4096, 4096), (4096, 11008), (11008, 4096), (4096, 14336), (14336, 4096)]  # (K, N)
SHAPES_DRY = [(256, 192), (128, 64)]
ROWS = [1, 2, 5, 9, 16]
LLAMA_7B = dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, intermediate_size=11008, vocab_size=32000)
LLAMA_8B = dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, intermediate_size=14336, vocab_size=128256)
TOY = dict(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=256, vocab_size=512)


def log(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Run:
    """The shared state: device, mode and the time left."""

    def __init__(self, dry: bool, budget_s: float) -> None:
        self.dry = dry
        self.device = torch.device("cpu" if dry else "cuda")
        self.deadline = time.monotonic() + budget_s
        self.peak_gbps = None if dry else next((v for k, v in PEAK_GBPS.items() if k in torch.cuda.get_device_name()),
                                               None)

    _model = None

    def model(self):
        """The random 7B INT4 stack, built once (it takes ~20 s and ~4 GB) for every section using it."""
        if self._model is None:
            self._model = random_int4_model(self)
        return self._model

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def sync(self) -> None:
        if not self.dry:
            torch.cuda.synchronize()


def section(report: dict, name: str, run: Run, need_s: float, fn: Callable[[Run], dict]) -> None:
    """Run one section into report[name]; a failure or lack of time is recorded, never fatal."""
    if run.left() < need_s:
        report[name] = {"skipped": f"not enough time left ({run.left():.0f} s < {need_s:.0f} s)"}
        return
    start = time.monotonic()
    log(f"{name} ...")
    try:
        report[name] = fn(run)
    except Exception as error:  # one broken section must not hide the others' figures
        report[name] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-3000:]}
    report[name]["seconds"] = round(time.monotonic() - start, 1)
    log(f"{name} done in {report[name]['seconds']} s")
    partial = os.environ.get("GPU_CHECK_PARTIAL")
    if partial:  # what is known so far, for gpu_check.sh to print if a hard timeout ends the run
        with open(partial, "w") as f:
            json.dump({**report, "ok": False, "incomplete": f"stopped after {name}"}, f)


# --- environment ---------------------------------------------------------------------------------


def environment(run: Run) -> dict:
    import triton

    env = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "cuda_runtime": torch.version.cuda, "dry": run.dry}
    if not run.dry:
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=torch.cuda.get_device_name(), capability=list(torch.cuda.get_device_capability()),
                   sms=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 1),
                   peak_gbps_assumed=run.peak_gbps)
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError) as error:
            env["driver"] = f"unknown ({error})"
    return env


# --- INT4 kernels -----------------------------------------------------------------------------------


def random_awq(K: int, N: int, group: int, dtype: torch.dtype, device: torch.device, seed: int):
    """Random AWQ tensors; scales sized so the weight has std ~ 1/sqrt(K), as a trained layer has."""
    gen = torch.Generator(device=device).manual_seed(seed)
    qweight = torch.randint(-(2**31), 2**31 - 1, (K, N // 8), dtype=torch.int32, device=device, generator=gen)
    qzeros = torch.randint(-(2**31), 2**31 - 1, (K // group, N // 8), dtype=torch.int32, device=device,
                           generator=gen)
    scales = (torch.rand(K // group, N, device=device, generator=gen) * 0.5 + 0.75) / (6.5 * K**0.5)
    return qweight, qzeros, scales.to(dtype)


def int4_correctness(run: Run) -> dict:
    from parley.kernels import reference, triton_int4

    shapes = SHAPES_DRY if run.dry else SHAPES_7B
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    tolerance = {"bf16": 1.5e-2, "fp16": 3e-3}
    cases, worst, invariant = [], 0.0, True
    for K, N in shapes:
        for name, dtype in dtypes.items():
            awq = random_awq(K, N, 128 if K % 128 == 0 else 64, dtype, run.device, seed=K + N)
            group = 128 if K % 128 == 0 else 64
            dense = reference.dequantize(awq[0], awq[1], awq[2].float(), group)
            x = torch.randn(16, K, device=run.device).to(dtype)
            full = triton_int4.int4_mm(x, *awq, group)
            ref = x.float() @ dense
            for m in ROWS:
                y = triton_int4.int4_mm(x[:m], *awq, group)
                error = ((y.float() - ref[:m]).abs().max() / ref[:m].abs().max()).item()
                same = torch.equal(y, full[:m])
                invariant &= same
                worst = max(worst, error / tolerance[name])
                cases.append({"K": K, "N": N, "dtype": name, "M": m, "rel_error": float(f"{error:.3g}"),
                              "rows_equal_m16": same})
            m = 33 if run.dry else 64  # the prefill GEMM
            xp = torch.randn(m, K, device=run.device).to(dtype)
            ref_p = xp.float() @ dense
            y = triton_int4.int4_mm(xp, *awq, group)
            error = ((y.float() - ref_p).abs().max() / ref_p.abs().max()).item()
            worst = max(worst, error / tolerance[name])
            cases.append({"K": K, "N": N, "dtype": name, "M": m, "rel_error": float(f"{error:.3g}")})
            del dense
    fused = []
    for K, N in ([(128, 128)] if run.dry else [(4096, 11008), (4096, 14336)]):
        awq = random_awq(K, 2 * N, 128 if K % 128 == 0 else 64, torch.bfloat16, run.device, seed=N)
        group = 128 if K % 128 == 0 else 64
        x = torch.randn(5, K, device=run.device).to(torch.bfloat16)
        gate, up = (x.float() @ reference.dequantize(awq[0], awq[1], awq[2].float(), group)).chunk(2, dim=-1)
        ref = torch.nn.functional.silu(gate) * up
        y = triton_int4.int4_silu_mul(x, *awq, group)
        error = ((y.float() - ref).abs().max() / ref.abs().max()).item()
        worst = max(worst, error / tolerance["bf16"])
        fused.append({"K": K, "N": N, "rel_error": float(f"{error:.3g}")})
    return {"ok": worst <= 1.0 and invariant, "worst_error_over_tolerance": round(worst, 3),
            "rows_bitwise_equal_for_every_m": invariant, "cases": cases, "silu_mul": fused}


def split_k_stress(run: Run) -> dict:
    """Every split-K value, launched back to back many times: the deterministic reduction must give the
    same bits every time, and the tickets must be zero afterwards."""
    from parley.kernels import triton_int4

    K, N = (256, 192) if run.dry else (4096, 4096)
    launches = 3 if run.dry else 300
    awq = random_awq(K, N, 128, torch.bfloat16, run.device, seed=11)
    x = torch.randn(9, K, device=run.device).to(torch.bfloat16)
    rows = {}
    for block_n, block_k, warps, stages in triton_int4.SKINNY_TILES:
        split = 1
        while split <= triton_int4.MAX_SPLIT_K and split <= K // block_k:
            config = {"BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_K": split, "num_warps": warps,
                      "num_stages": stages}
            first = triton_int4._launch_skinny(x, *awq, 128, gated=False, config=config)
            outs = [triton_int4._launch_skinny(x, *awq, 128, gated=False, config=config) for _ in range(launches)]
            run.sync()
            differing = sum(not torch.equal(o, first) for o in outs)
            rows[f"n{block_n}_k{block_k}_split{split}"] = differing
            split *= 2
    tickets = max(t.abs().max().item() for (_, _), (_, t) in triton_int4._workspaces.items())
    return {"ok": not any(rows.values()) and tickets == 0, "launches_per_config": launches,
            "differing_launches": rows, "tickets_left": tickets}


def timed_us(fn: Callable[[], object], run: Run, reps: int = 50) -> float:
    """Mean microseconds per call: inside a CUDA graph on a GPU (launch overhead excluded), wall clock on CPU."""
    if run.dry:
        start = time.perf_counter()
        for _ in range(2):
            fn()
        return (time.perf_counter() - start) / 2 * 1e6
    from triton.testing import do_bench_cudagraph

    fn()
    return do_bench_cudagraph(fn, rep=reps) * 1e3


def int4_speed(run: Run) -> dict:
    from parley.kernels import triton_int4

    shapes = SHAPES_DRY if run.dry else SHAPES_7B
    rows = []
    for K, N in shapes:
        awq = random_awq(K, N, 128 if K % 128 == 0 else 64, torch.float16, run.device, seed=3)
        group = 128 if K % 128 == 0 else 64
        nbytes = sum(t.numel() * t.element_size() for t in awq)
        # Enough copies, used in turn, that the weights cannot sit in L2 (~50-60 MB) between calls.
        n_copies = 1 if run.dry else max(1, min(32, 4 * 60 * 2**20 // nbytes))
        copies = [tuple(t.clone() for t in awq) for _ in range(n_copies)]

        def all_copies(x: torch.Tensor, copies: list = copies, group: int = group) -> list:
            return [triton_int4.int4_mm(x, *c, group) for c in copies]

        for m in (1, 16):
            x = torch.randn(m, K, device=run.device).to(torch.float16)
            us = timed_us(lambda x=x: all_copies(x), run) / n_copies
            gbps = (nbytes + 2 * m * (K + N)) / (us * 1e-6) / 1e9
            row = {"K": K, "N": N, "M": m, "us": round(us, 2), "gbps": round(gbps, 1),
                   "config": triton_int4.skinny_config(N, K, group, run.device)}
            if run.peak_gbps:
                row["pct_of_peak"] = round(100 * gbps / run.peak_gbps, 1)
            rows.append(row)
        del copies
    return {"rows": rows, "peak_gbps": run.peak_gbps}


# --- attention ----------------------------------------------------------------------------------------


def attention(run: Run) -> dict:
    from parley.kernels import triton_attention as ta

    H, KVH, D, L = (4, 2, 64, 48) if run.dry else (32, 8, 128, 4096)
    positions = [0, 17, L // 2, L - 2, L - 1] if run.dry else [0, 1000, 2047, 4094, 4095]
    gen = torch.Generator(device=run.device).manual_seed(5)
    k = torch.randn(KVH, L, D, device=run.device, generator=gen)
    v = torch.randn(KVH, L, D, device=run.device, generator=gen)
    q = torch.randn(len(positions), H, D, device=run.device, generator=gen).to(torch.bfloat16)
    pos = torch.tensor(positions, device=run.device)
    result = {}
    for kind in ta.KV_KINDS:
        cache = ta.new_cache(kind, KVH, L, D, run.device, torch.bfloat16)
        ta.write_kv(kind, cache, k, v, torch.arange(L, device=run.device))
        out = ta.decode_attention(q, kind, cache, pos, D**-0.5)
        kd, vd = (t.double() for t in ta.dequantize_cache(kind, cache))
        ref = torch.empty(q.shape, dtype=torch.float64, device=run.device)
        for t, p in enumerate(positions):
            kk = kd.repeat_interleave(H // KVH, 0)[:, : p + 1]
            vv = vd.repeat_interleave(H // KVH, 0)[:, : p + 1]
            scores = torch.einsum("hd,hld->hl", q[t].double(), kk) * D**-0.5
            ref[t] = torch.einsum("hl,hld->hd", scores.softmax(-1), vv)
        error = ((out.double() - ref).abs().max() / ref.abs().max()).item()
        alone = all(torch.equal(ta.decode_attention(q[t : t + 1], kind, cache, pos[t : t + 1], D**-0.5)[0], out[t])
                    for t in range(len(positions)))
        one = q[-1:]
        us = timed_us(lambda c=cache, k=kind, one=one: ta.decode_attention(one, k, c, pos[-1:], D**-0.5), run)
        kv_bytes = sum(t.numel() * t.element_size() for t in cache.values())  # the whole cache: pos L-1
        row = {"rel_error": float(f"{error:.3g}"), "rows_bitwise_independent_of_T": alone,
               "us_one_row_full_context": round(us, 1), "kv_bytes": kv_bytes,
               "gbps_if_read_once_per_head_group": round(kv_bytes / (us * 1e-6) / 1e9, 1)}
        result[kind] = row
    result["ok"] = all(r["rel_error"] < 2e-2 and r["rows_bitwise_independent_of_T"] for r in result.values())
    result["shape"] = {"H": H, "KVH": KVH, "D": D, "L": L}
    return result


def sdpa_backends(run: Run) -> dict:
    """Which SDPA backends take a decode-shaped call (T = 1 and 5 queries over a 2,048-slot window),
    with the boolean mask the model passes and without one, and how long each takes: what the model's
    attention should ask for on CUDA."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    H, D, window = (4, 64, 64) if run.dry else (32, 128, 2048)
    dtype = torch.float32 if run.dry else torch.bfloat16
    result = {}
    for T in (1, 5):
        q = torch.randn(1, H, T, D, device=run.device, dtype=dtype)
        k = torch.randn(1, H, window, D, device=run.device, dtype=dtype)
        v = torch.randn_like(k)
        positions = torch.arange(window - T, window, device=run.device)
        mask = (torch.arange(window, device=run.device)[None, :] <= positions[:, None])[None, None]
        for backend in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
            for masked in (True, False):
                def call(backend=backend, q=q, k=k, v=v, mask=mask if masked else None):
                    with sdpa_kernel(getattr(SDPBackend, backend)):
                        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                key = f"T{T}_{backend.lower()}_{'bool_mask' if masked else 'no_mask'}"
                try:
                    result[key] = {"us": round(timed_us(call, run), 1)}
                except Exception as error:  # a backend refusing the call is the finding
                    result[key] = {"unsupported": f"{type(error).__name__}: {str(error)[:160]}"}
    return result


# --- decode of a random-weight 7B INT4 stack ----------------------------------------------------------


def random_int4_model(run: Run, shape: dict | None = None):
    """A llama-shaped Transformer with random INT4 decoder weights (group 128), the online rotation before
    down_proj that Parley's own quantization ships (models/quantize/hadamard.py), and a bf16 head. A bf16
    model is built first (16 GB at 8B: the GPU holds it; `load_8b` measures the streamed load)."""
    from parley.models.config import ModelConfig
    from parley.models.device_prep import prepare_for_device
    from parley.models.quantize import hadamard
    from parley.models.quantize.int4_linear import Int4Linear, decoder_linears
    from parley.models.transformer import Transformer

    shape = TOY if run.dry else (shape or LLAMA_7B)
    dtype = torch.float32 if run.dry else torch.bfloat16
    config = ModelConfig(arch="llama", max_seq_len=1024, **shape)
    with torch.device(run.device):
        model = Transformer(config).to(dtype).eval()
    for i, (parent, name, linear) in enumerate(decoder_linears(model)):
        int4 = Int4Linear(linear.in_features, linear.out_features, 128, device=run.device, dtype=dtype)
        int4.qweight, int4.qzeros, int4.scales = random_awq(linear.in_features, linear.out_features, 128,
                                                            torch.float16, run.device, seed=i)
        setattr(parent, name, int4)
        del linear
    block = hadamard.block_size(config.intermediate_size)
    diag = hadamard.rotation_diag(config.intermediate_size, block)
    hadamard.install(model, {i: layer.mlp.down_proj for i, layer in enumerate(model.layers)}, diag, block)
    prepare_for_device(model, native=False)  # the int8 head over INT4 layers, as on CUDA (--dry too)
    if not run.dry:
        torch.cuda.empty_cache()
    return model


def model_bytes_per_token(model, context: int) -> int:
    """Bytes a decode step must read: INT4 weights with zeros and scales, the head, one embedding row,
    norms, and the KV cache up to `context`."""
    total = 0
    for module in model.modules():
        for name in ("qweight", "qzeros", "scales"):
            t = getattr(module, name, None)
            if isinstance(t, torch.Tensor) and module is not model:
                total += t.numel() * t.element_size()
    head = getattr(model.lm_head.prepared, "weight", None)  # CUDA: a dense bf16 head
    total += head.numel() * head.element_size() if head is not None else model.config.vocab_size * model.config.dim
    c = model.config
    total += c.dim * model.embed_tokens.weight.element_size() * (1 + 2 * c.n_layers)
    total += 2 * c.n_layers * c.n_kv_heads * c.head_dim * context * model.norm.weight.element_size()
    return total


def count_kernels(fn: Callable[[], object]) -> int | None:
    """Kernel launches of one call, from the profiler (CUDA only)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def decode(run: Run, model=None, label: str = "random llama 7B shape, INT4 g128, bf16 head",
           compiled: bool = True) -> dict:
    from parley.engine.cuda_graphs import GraphedStep

    model = model if model is not None else run.model()
    prompt_len, steps = (16, 4) if run.dry else (256, 64)
    window = 64 if run.dry else 512
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=gen).to(run.device)
    cache = model.new_cache(window)
    step_fn = lambda tokens, positions, window: model(tokens, positions, cache, False, window)  # noqa: E731
    bytes_per_token = model_bytes_per_token(model, prompt_len + steps // 2)
    result: dict = {"model": label if not run.dry else "toy",
                    "prompt_tokens": prompt_len, "decode_tokens": steps, "bytes_per_token": bytes_per_token}

    def generate(step: Callable) -> tuple[float, list[int]]:
        with torch.inference_mode():
            model(prompt, torch.arange(prompt_len, device=run.device)[None], cache, True, window)
            token = torch.zeros(1, 1, dtype=torch.long, device=run.device)
            out = []
            run.sync()
            start = time.perf_counter()
            for i in range(steps):
                pos = torch.full((1, 1), prompt_len + i, dtype=torch.long, device=run.device)
                token = step(token, pos, window=window)[:, -1:].argmax(-1)
                out.append(token)
            run.sync()
            elapsed = time.perf_counter() - start
        return steps / elapsed, [int(t) for t in torch.cat(out, dim=1)[0].tolist()]

    variants: dict[str, Callable] = {"eager": step_fn}
    if not run.dry:  # graphs before compile: torch.compile of 32 layers is the slow part of the run
        variants["cuda_graphs"] = GraphedStep(step_fn, run.device, capacity=window)
        if compiled:
            variants["compiled"] = torch.compile(step_fn, dynamic=False)
    tokens_by_variant = {}
    for name, step in variants.items():
        if run.left() < (150 if name == "compiled" else 30) and name != "eager":
            result[name] = {"skipped": "time"}
            continue
        try:
            generate(step)  # warm-up: compiles, autotunes, captures
            tok_s, tokens_by_variant[name] = generate(step)
        except Exception as error:
            result[name] = {"error": f"{type(error).__name__}: {error}"}
            continue
        row = {"tok_s": round(tok_s, 1), "gbps": round(tok_s * bytes_per_token / 1e9, 1)}
        if run.peak_gbps:
            row["pct_of_bandwidth_limit"] = round(100 * tok_s * bytes_per_token / (run.peak_gbps * 1e9), 1)
            row["bandwidth_limit_tok_s"] = round(run.peak_gbps * 1e9 / bytes_per_token, 1)
        if not run.dry:
            pos = torch.full((1, 1), prompt_len, dtype=torch.long, device=run.device)
            token = torch.zeros(1, 1, dtype=torch.long, device=run.device)
            with torch.inference_mode():
                row["kernels_per_step"] = count_kernels(lambda s=step, t=token, p=pos: s(t, p, window=window))
            # What the CPU launches per step: every kernel, or one graph (plus the input copies).
            row["cpu_launches_per_step"] = 1 if name == "cuda_graphs" else row["kernels_per_step"]
            if name == "cuda_graphs":
                row["graphs_captured"] = len(step.graphs)
                row["fallbacks"] = step.fallbacks
        result[name] = row
    if "eager" in tokens_by_variant:
        result["same_tokens_as_eager"] = {n: t == tokens_by_variant["eager"] for n, t in tokens_by_variant.items()}
    return result


def batch_invariance(run: Run) -> dict:
    """A verification pass over 5 tokens against 5 single-token steps on the same cache: are the
    logits bitwise equal (what makes speculative output equal plain decoding)?"""
    model = run.model()
    window = 64 if run.dry else 512
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (1, 40), generator=gen).to(run.device)
    extra = torch.randint(0, model.config.vocab_size, (1, 5), generator=gen).to(run.device)
    with torch.inference_mode():
        cache = model.new_cache(window)
        model(prompt, torch.arange(40, device=run.device)[None], cache, False, window)
        together = model(extra, torch.arange(40, 45, device=run.device)[None], cache, False, window)[0]
        apart = torch.cat([model(extra[:, i : i + 1], torch.full((1, 1), 40 + i, device=run.device), cache, False,
                                 window)[0] for i in range(5)])
    diff = (together - apart).abs().max().item()
    result = {"bitwise_equal": torch.equal(together, apart), "max_abs_logit_diff": diff,
              "argmax_equal": torch.equal(together.argmax(-1), apart.argmax(-1)),
              "note": "attention is the model's SDPA path; the INT4 linears are row-invariant by construction"}
    return result


def shared_passes(run: Run) -> dict:
    """The PyTorch path's shared pass (PARLEY_SHARED_PASSES=1): four sequences' decode rows in one 16-row pass
    (`Transformer.forward_spans`) against each in its own 16-row pass: bitwise equal logits, and the time of
    each, eager and as a CUDA graph (a shared pass runs eager in the engine; a lone one too with the setting on)."""
    from parley.engine.cached_model import ROW_TILE
    from parley.models.transformer import Span

    model = run.model()
    window = 64 if run.dry else 512
    gen = torch.Generator().manual_seed(2)
    caches, spans, tokens = [], [], []
    with torch.inference_mode():
        for i, n in enumerate((40, 23, 31, 12)):
            cache = model.new_cache(window)
            prompt = torch.randint(0, model.config.vocab_size, (1, n), generator=gen).to(run.device)
            model(prompt, torch.arange(n, device=run.device)[None], cache, True, window)
            caches.append(cache)
            spans.append(Span(slice(i, i + 1), torch.tensor([n], device=run.device), cache))
        tokens = torch.randint(0, model.config.vocab_size, (4,), generator=gen).to(run.device)
        alone = [model.forward_spans(tokens[i : i + 1], [s._replace(rows=slice(0, 1))], ROW_TILE)
                 for i, s in enumerate(spans)]
        together = model.forward_spans(tokens, spans, ROW_TILE)
        equal = all(torch.equal(a[0], together[i]) for i, a in enumerate(alone))

        def one_by_one() -> None:
            for i, s in enumerate(spans):
                model.forward_spans(tokens[i : i + 1], [s._replace(rows=slice(0, 1))], ROW_TILE)

        def shared() -> None:
            model.forward_spans(tokens, spans, ROW_TILE)

        result: dict = {"bitwise_equal": equal}
        for name, fn in (("four_passes", one_by_one), ("one_shared_pass", shared)):
            run.sync()
            start = time.perf_counter()
            for _ in range(3):
                fn()
            run.sync()
            result[name] = {"eager_us": round((time.perf_counter() - start) / 3 * 1e6, 1),
                            "graph_us": round(timed_us(fn, run), 1)}
    return result


# --- the Llama-3.1-8B shape ----------------------------------------------------------------------------


def peak_gpu_gb(run: Run) -> float | None:
    return None if run.dry else round(torch.cuda.max_memory_allocated() / 2**30, 2)


def reset_peak(run: Run) -> None:
    if not run.dry:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def load_8b(run: Run) -> dict:
    """The random 8B checkpoint as people's models come (bf16 safetensors shards), written into a temp dir
    (GPU_CHECK_TMP, default the system's), then loaded onto the GPU by the loader every model goes through."""
    import tempfile

    from parley.models.loading import load_model
    from parley.models.resolve import ModelFiles

    from . import random_weights as rw

    shape = "small" if run.dry else "llama-3.1-8b"
    saved = os.environ.get("PARLEY_CACHE_DIR")
    with tempfile.TemporaryDirectory(dir=os.environ.get("GPU_CHECK_TMP")) as tmp:
        os.environ["PARLEY_CACHE_DIR"] = tmp
        try:
            start = time.monotonic()
            src = rw.checkpoint(shape, tokenizer=False)
            write_s = time.monotonic() - start
            nbytes = sum(f.stat().st_size for f in src.glob("*.safetensors"))
            reset_peak(run)
            start = time.monotonic()
            model = load_model(ModelFiles(ref=shape, kind="dir", path=src), dtype=torch.bfloat16, device=run.device)
            run.sync()
            load_s = time.monotonic() - start
            held = sum(t.numel() * t.element_size() for t in model.state_dict().values())
            del model
        finally:
            if saved is None:
                os.environ.pop("PARLEY_CACHE_DIR", None)
            else:
                os.environ["PARLEY_CACHE_DIR"] = saved
    return {"shape": shape, "checkpoint_gb": round(nbytes / 1e9, 2), "write_s": round(write_s, 1),
            "load_s": round(load_s, 2), "load_gbps": round(nbytes / load_s / 1e9, 2),
            "held_gb": round(held / 1e9, 2), "peak_gpu_gib": peak_gpu_gb(run)}


def quantize_8b(run: Run) -> dict:
    """One decoder layer of the 8B shape quantized as a first run does on this device, and rounded to nearest:
    the per-layer cost the full model's time is estimated from (x32; the model-wide rotation, the teacher's
    answers and the distillation come on top)."""
    from parley.models.config import ModelConfig
    from parley.models.quantize import hadamard
    from parley.models.quantize.awq import LayerRunner, awq_layer
    from parley.models.quantize.int4_linear import decoder_linears
    from parley.models.quantize.methods import default_calibration_size, first_run_settings
    from parley.models.quantize.pack import quantize_weight
    from parley.models.transformer import Transformer

    shape = {**(TOY if run.dry else LLAMA_8B), "n_layers": 1}
    n_layers = (TOY if run.dry else LLAMA_8B)["n_layers"]
    config = ModelConfig(arch="llama", max_seq_len=1024, **shape)
    dtype = torch.float32 if run.dry else torch.float16  # the quantizer's dtype on CUDA
    samples, tokens = (4, 32) if run.dry else default_calibration_size(run.device)
    with torch.device(run.device):
        model = Transformer(config).to(dtype).eval()
    settings = first_run_settings(128, run.device)
    gen = torch.Generator(device=run.device).manual_seed(9)
    x = torch.randn(samples, tokens, config.dim, device=run.device, generator=gen).to(dtype)
    inter = config.intermediate_size
    block = hadamard.block_size(inter, settings.hadamard_down)
    rotation = (hadamard.rotation_diag(inter, block).to(run.device), block) if block > 1 else None
    layer = model.layers[0]
    weights = [lin.weight.detach().clone() for _, _, lin in decoder_linears(model)]
    reset_peak(run)
    run.sync()
    start = time.monotonic()
    for w in weights:
        quantize_weight(w, 128)
    run.sync()
    rtn_s = time.monotonic() - start
    start = time.monotonic()
    awq_layer(layer, x, LayerRunner(model, tokens, run.device, dtype, settings.chunk), settings, 128,
              down_rotation=rotation)
    run.sync()
    full_s = time.monotonic() - start
    return {"calibration": [samples, tokens], "rtn_s_per_layer": round(rtn_s, 3),
            "first_run_s_per_layer": round(full_s, 2), "first_run_layers_s_estimate": round(full_s * n_layers, 1),
            "layers": n_layers, "peak_gpu_gib": peak_gpu_gb(run),
            "note": "per layer, without the model-wide rotation, teacher answers and distillation"}


def decode_8b(run: Run) -> dict:
    """Decode of the 8B shape as a random INT4 stack (eager and CUDA graphs), its peak GPU memory."""
    run._model = None  # the 7B stack's memory back first
    reset_peak(run)
    model = random_int4_model(run, LLAMA_8B)
    built = peak_gpu_gb(run)
    reset_peak(run)
    result = decode(run, model, "random llama 3.1 8B shape (GQA 32/8, untied), INT4 g128, bf16 head",
                    compiled=False)
    result.update(peak_gpu_gib_building=built, peak_gpu_gib_decoding=peak_gpu_gb(run))
    del model
    return result


SECTIONS: dict[str, tuple[float, Callable[[Run], dict]]] = {  # name: (seconds it needs to start, function)
    "environment": (0, environment), "int4_correctness": (30, int4_correctness),
    "split_k_stress": (20, split_k_stress), "int4_speed": (30, int4_speed), "attention": (20, attention),
    "sdpa_backends": (20, sdpa_backends), "decode": (90, decode), "batch_invariance": (30, batch_invariance),
    "shared_passes": (30, shared_passes),
    "load_8b": (90, load_8b), "quantize_8b": (40, quantize_8b), "decode_8b": (60, decode_8b),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--dry", action="store_true", help="CPU, toy shapes, Triton interpreted (for tests)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop starting sections after this")
    parser.add_argument("--only", default=None, metavar="NAMES",
                        help="comma-separated sections to run (environment always runs), e.g. "
                             "load_8b,quantize_8b,decode_8b for the 8B shape alone")


def run(args: argparse.Namespace) -> int:
    if args.dry and os.environ.get("TRITON_INTERPRET") != "1":
        print("--dry needs TRITON_INTERPRET=1 in the environment (set before Triton is imported)", file=sys.stderr)
        return 2
    if not args.dry and not torch.cuda.is_available():
        print("no CUDA device: run with --dry (and TRITON_INTERPRET=1) to check the command on CPU", file=sys.stderr)
        return 2
    state = Run(args.dry, args.budget_s)
    torch.manual_seed(0)
    report: dict = {}
    wanted = set(SECTIONS) if args.only is None else {"environment", *args.only.split(",")}
    unknown = wanted - set(SECTIONS)
    if unknown:
        print(f"--only: no section {', '.join(sorted(unknown))}; the sections are {', '.join(SECTIONS)}",
              file=sys.stderr)
        return 2
    for name, (need_s, fn) in SECTIONS.items():
        if name in wanted:
            section(report, name, state, need_s, fn)
    report["ok"] = all(report.get(s, {}).get("ok", True) and "error" not in report.get(s, {}) for s in report
                       if isinstance(report.get(s), dict))
    print(json.dumps(report))
    return 0 if report["ok"] else 1
