"""Reliability figures: kill -9 during quantization, a long conversation soak, broken model files, bad live params.

Eight checks (`--only` picks some), summed up in one table: inputs tried, handled cleanly, tracebacks, hangs,
data lost.
- kill: `parley quantize` of a tiny model (a subprocess, its own cache folder) SIGKILLed at seeded random moments of a
  build; after each kill no folder a load would use is partial, and the next complete run leaves no
  temporary folder behind.
- soak: one conversation of --turns turns on the embedded model (fp32, greedy, short replies); resident
  memory after the warm-up (the first tenth of the turns) against the end.
- inputs: every kind of broken GGUF, safetensors, config.json, tokenizer and chat template, each run as
  `parley generate --model CASE` in a subprocess: a one-line error naming the file and the field with what
  to do, never a traceback, a hang or an absurd allocation.
- cancel: replies on the default engine (AWQ INT4, sampled, with speculation) cancelled at --cancels seeded
  random points; after each, the next reply at temperature 0 must equal a fresh engine's reply to the same
  visible history (the cache holds exactly what was shown, nothing the cancelled step computed).
- params: invalid values (negative, huge, inf, NaN, wrong type) set on the live GenerationParams from another
  thread mid-reply: the reply must end with a Done event, never an exception.
- serve: a hostile client against `parley serve` on the embedded model (bad values, broken HTTP, half-sent and
  half-closed requests, resets, near-miss API keys); see `bench_faults_network`.
- remote: hostile servers against the `--server` backend (malformed model lists and events, silence, a
  server that ignores max_tokens, an endless line).
- fuzz: --fuzz seeded mutations of each of a model config, a GGUF header, a chat template and an HTTP request
  (`bench_fuzz`); a failure prints the seed that rebuilds it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .harness import add_json_argument, emit, median

CHECKS = ("kill", "soak", "inputs", "params", "cancel", "serve", "remote", "fuzz")
QUANTIZE_FLAGS = ["--calib", "builtin", "--samples", "4", "--seq-len", "32"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated checks to run ({', '.join(CHECKS)})")
    p.add_argument("--kills", type=int, default=10, help="SIGKILLs of `parley quantize` (default 10)")
    p.add_argument("--model", default=None,
                   help="what `parley quantize` builds in the kill check (default: a tiny 2-layer model with "
                        "the embedded model's tokenizer, so ten builds take minutes, not hours)")
    p.add_argument("--turns", type=int, default=300, help="turns of the soak conversation (default 300)")
    p.add_argument("--trials", type=int, default=40, help="replies disturbed with invalid live params")
    p.add_argument("--cancels", type=int, default=200, help="replies cancelled at random points (default 200)")
    p.add_argument("--quant", default="awq", choices=("awq", "none"),
                   help="the engine the cancel check runs on (default awq, the default engine)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random choice (kill moments, values)")
    p.add_argument("--fuzz", type=int, default=500, metavar="N",
                   help="fuzz cases of each kind: config, GGUF header, chat template, HTTP request (default 500)")
    p.add_argument("--case-timeout", type=float, default=180.0,
                   help="seconds a broken-input case may take before it counts as a hang")
    add_json_argument(p)


def run(args: argparse.Namespace) -> int:
    only = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = sorted(set(only) - set(CHECKS))
    if unknown:
        raise ValueError(f"--only {','.join(unknown)}: expected some of {', '.join(CHECKS)}")
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if args.json else \
        (lambda text: print(text, flush=True))
    results: dict[str, Any] = {"bench": "faults", "seed": args.seed}
    with tempfile.TemporaryDirectory(prefix="parley-faults-") as tmp:
        work = Path(tmp)
        if "kill" in only:
            results["kill"] = kill_check(args, work / "kill", say)
        if "inputs" in only:
            results["inputs"] = inputs_check(args, work / "inputs", say)
        if "remote" in only:
            from .faults_network import remote_cases

            results["remote"] = remote_cases(args.case_timeout)
            say(f"remote: {results['remote']['clean']}/{results['remote']['tried']} handled cleanly")
        if "soak" in only or "params" in only or "serve" in only:
            from ..engine.engine import Engine

            engine = Engine.load(None, quant="none", device="cpu")
            if "soak" in only:
                results["soak"] = soak_check(engine, args.turns, say)
            if "params" in only:
                results["params"] = params_check(engine, args.trials, args.seed, say)
            if "serve" in only:
                from .faults_network import serve_cases

                results["serve"] = serve_cases(engine, args.case_timeout)
                say(f"serve: {results['serve']['clean']}/{results['serve']['tried']} handled cleanly")
        if "fuzz" in only:
            from .fuzz import fuzz

            results["fuzz"] = fuzz(args.fuzz, args.seed, say=say)
        if "cancel" in only:
            from ..engine.engine import Engine

            engine = Engine.load(None, quant=args.quant, device="cpu")
            results["cancel"] = cancel_check(engine, args.cancels, args.seed, say)
    results["table"] = table(results)
    return emit(results, args.json, lines)


def table(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per check that feeds bad input: tried, handled cleanly, tracebacks, hangs, data lost."""
    rows = []
    if "kill" in results:
        k = results["kill"]
        lost = k["partial_folders"] + k["temp_left_after_next_run"] + (not k["next_run_ok"])
        rows.append(("kill -9 during quantize", k["kills"], k["kills"] - k["partial_folders"], 0, 0, lost))
    if "inputs" in results:
        i = results["inputs"]
        why = Counter(f["why"] for f in i["failures"])
        hangs = sum(n for w, n in why.items() if "hang" in w)
        rows.append(("broken model files", i["cases"], i["clear"], why["a traceback"], hangs, 0))
    if "params" in results:
        p = results["params"]
        rows.append(("invalid live params", p["trials"], p["trials"] - p["crashes"], p["crashes"], 0, 0))
    if "cancel" in results:
        c = results["cancel"]
        rows.append(("cancel at random points", c["points"], c["points"] - c["mismatches"], 0, 0, c["mismatches"]))
    for key, name in (("serve", "parley serve, hostile client"), ("remote", "--server, hostile server")):
        if key in results:
            r = results[key]
            rows.append((name, r["tried"], r["clean"], r["tracebacks"], r["hangs"], r["data_lost"]))
    for kind, r in results.get("fuzz", {}).items():
        rows.append((f"fuzz: {kind}", r["cases"], r["cases"] - len(r["failures"]), len(r["failures"]), 0, 0))
    names = ("check", "tried", "clean", "tracebacks", "hangs", "data_lost")
    rows.append(("total", *(sum(r[i] for r in rows) for i in range(1, 6))))
    return [dict(zip(names, r, strict=True)) for r in rows]


def lines(results: dict[str, Any]) -> list[str]:
    out = [f"parley bench faults (seed {results['seed']})", f"{'check':32} {'inputs tried':>12} "
           f"{'handled cleanly':>16} {'tracebacks':>10} {'hangs':>6} {'data lost':>9}"]
    for r in results["table"]:
        out.append(f"{r['check']:32} {r['tried']:>12} {r['clean']:>16} {r['tracebacks']:>10} {r['hangs']:>6} "
                   f"{r['data_lost']:>9}")
    for key in ("serve", "remote"):
        for f in results.get(key, {}).get("failures", []):
            out.append(f"  FAIL {key}: {f['case']}: {f['why']}: {f['detail']}")
    for kind, r in results.get("fuzz", {}).items():
        for f in r["failures"]:
            out.append(f"  FAIL fuzz {kind} seed {f['seed']}: {f['why']}")
    if "kill" in results:
        k = results["kill"]
        out.append(f"kill -9 during quantize: {k['kills']} kills over a {k['build_s']:.0f} s build; partial folders "
                   f"a load would use: {k['partial_folders']}; temporary folders left after the next run: "
                   f"{k['temp_left_after_next_run']}; next run complete: {k['next_run_ok']}")
    if "soak" in results:
        s = results["soak"]
        out.append(f"soak: {s['turns']} turns, RSS {s['rss_after_warmup_mb']:.0f} MB after {s['warmup_turns']} "
                   f"turns -> {s['rss_end_mb']:.0f} MB at the end ({s['rss_growth_pct']:+.1f}%); replies ended "
                   f"{s['done']}; median turn {s['median_turn_s']:.2f} s")
    if "inputs" in results:
        i = results["inputs"]
        out.append(f"broken inputs: {i['clear']}/{i['cases']} got a one-line error naming file and field "
                   f"(the unbroken control model answers: {i['control_ok']})")
        for f in i["failures"]:
            out.append(f"  FAIL {f['case']}: {f['why']}: {f['stderr_tail']}")
    if "params" in results:
        p = results["params"]
        out.append(f"invalid live params mid-reply: {p['trials']} replies, {p['crashes']} crashes; "
                   f"replies ended {p['done']}")
    if "cancel" in results:
        c = results["cancel"]
        out.append(f"cancel at random points ({c['engine']}): {c['points']} replies, {c['cancelled']} cancelled "
                   f"mid-stream; next reply differs from a fresh engine's after {c['mismatches']}")
    return out


# kill -9 during quantization

def _quantize_cmd(model: str | None) -> list[str]:
    return [sys.executable, "-m", "parley.app.cli", "quantize", *([model] if model else []), *QUANTIZE_FLAGS]


def kill_check(args: argparse.Namespace, root: Path, say: Callable[[str], None]) -> dict[str, Any]:
    from ..models.quantize.cache import verify

    env = {**os.environ, "PARLEY_CACHE_DIR": str(root / "cache"), "HF_HUB_OFFLINE": "1"}
    rng = random.Random(args.seed)
    model = args.model or str(_tiny_model_dir(root / "source"))
    say(f"kill: timing one complete build of {model} ...")
    t0 = time.monotonic()
    subprocess.run(_quantize_cmd(model), env=env, check=True, capture_output=True)
    build_s = time.monotonic() - t0
    awq = root / "cache" / "awq"

    def partial_folders() -> int:
        bad = 0
        for folder in awq.iterdir() if awq.is_dir() else []:
            if folder.name.startswith("."):
                continue  # a build in progress or a dead one's leftovers: never loaded
            try:
                manifest = json.loads((folder / "manifest.json").read_text())
                bad += verify(folder, manifest["key"]) is not None
            except (OSError, ValueError, KeyError):
                bad += 1
        return bad

    partial, moments = 0, []
    for i in range(args.kills):
        shutil.rmtree(awq, ignore_errors=True)
        delay = rng.uniform(0.5, build_s * 1.05)
        moments.append(round(delay, 2))
        proc = subprocess.Popen(_quantize_cmd(model), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        partial += partial_folders()
        say(f"kill {i + 1}/{args.kills} at {delay:.1f} s: partial folders so far {partial}")
    done = subprocess.run(_quantize_cmd(model), env=env, capture_output=True, text=True)
    folder = Path(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 and done.stdout.strip() else None
    next_ok = folder is not None and partial_folders() == 0 and (folder / "manifest.json").is_file()
    temp_left = len(list(awq.glob(".tmp-*"))) if awq.is_dir() else 0
    return {"kills": args.kills, "build_s": round(build_s, 1), "kill_moments_s": moments,
            "partial_folders": partial, "temp_left_after_next_run": temp_left, "next_run_ok": next_ok}


# a long conversation

def _rss_mb() -> float:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


TOPICS = ("tea", "rivers", "clocks", "bread", "maps", "owls", "glass", "chess", "salt", "kites")


def soak_check(engine, turns: int, say: Callable[[str], None]) -> dict[str, Any]:
    import gc

    from ..engine.events import consume
    from ..engine.params import GenerationParams

    params = GenerationParams(temperature=0, max_new_tokens=12, speculation="auto")
    session = engine.session()
    messages: list[dict[str, str]] = []
    warmup = max(1, turns // 10)
    done: Counter[str] = Counter()
    seconds, rss_warm = [], 0.0
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Turn {turn}: one short sentence about {TOPICS[turn % 10]}."})
        t0 = time.monotonic()
        reply = consume(session.reply(messages, params, threading.Event()))
        reason = reply.done.reason if reply.done else "none"
        seconds.append(time.monotonic() - t0)
        done[reason] += 1
        messages.append({"role": "assistant", "content": reply.text})
        if reason == "length":  # the window is full: drop the oldest exchange, as a person would
            del messages[:2]
        if turn + 1 == warmup:
            gc.collect()
            rss_warm = _rss_mb()
        if (turn + 1) % 50 == 0:
            say(f"soak: {turn + 1}/{turns} turns, RSS {_rss_mb():.0f} MB")
    gc.collect()
    rss_end = _rss_mb()
    return {"turns": turns, "warmup_turns": warmup, "rss_after_warmup_mb": round(rss_warm, 1),
            "rss_end_mb": round(rss_end, 1), "rss_growth_pct": round(100 * (rss_end / rss_warm - 1), 2),
            "done": dict(done), "median_turn_s": round(median(seconds), 3)}


# cancel at random points

def collect(engine, messages, params, cancel_after: int | None = None) -> tuple[str, str]:
    """(shown text, how the reply ended), cancelling once `cancel_after` text deltas have been shown."""
    from ..engine.events import consume

    cancel = threading.Event()

    def stop_after(_ev, so_far) -> None:
        if cancel_after is not None and so_far.deltas >= cancel_after:
            cancel.set()

    reply = consume(engine.session().reply(messages, params, cancel), stop_after)
    return reply.text, reply.done.reason if reply.done else "none"


def cancel_check(engine, points: int, seed: int, say: Callable[[str], None]) -> dict[str, Any]:
    """Each point: a sampled reply (speculation on) to a random stretch of held-out text, cancelled after 1..12
    shown deltas; then the next reply at temperature 0 against a fresh engine on the same weights."""
    from dataclasses import replace

    from ..engine.engine import Engine
    from ..engine.params import GenerationParams

    first_params = GenerationParams(temperature=0.8, max_new_tokens=16, speculation="auto")
    next_params = GenerationParams(temperature=0, max_new_tokens=8, speculation="off")
    texts = [p.read_text() for p in sorted((Path(__file__).resolve().parents[1] / "assets" / "heldout").glob("*.txt"))]

    def fresh() -> Engine:
        return engine.fresh()

    rng = random.Random(seed)
    mismatches: list[tuple[int, int]] = []
    cancelled = 0
    for i in range(points):
        text = rng.choice(texts)
        start = rng.randrange(len(text) - 200)
        snippet = text[start : start + rng.randint(20, 200)].split(" ", 1)[-1].rsplit(" ", 1)[0].strip() or "Hello"
        first = [{"role": "user", "content": snippet}]
        at = rng.randint(1, 12)
        shown, reason = collect(engine, first, replace(first_params, seed=i), cancel_after=at)
        cancelled += reason == "cancelled"
        visible = [*first, {"role": "assistant", "content": shown}, {"role": "user", "content": "Go on."}]
        if collect(engine, visible, next_params) != collect(fresh(), visible, next_params):
            mismatches.append((i, at))
        if (i + 1) % 50 == 0:
            say(f"cancel: {i + 1}/{points} points, {len(mismatches)} mismatches")
    return {"engine": f"{engine.model_name} {engine.quantization}", "points": points, "cancelled": cancelled,
            "mismatches": len(mismatches), "mismatch_points": mismatches[:20]}


# invalid live parameters

INVALID = [("temperature", -1.0), ("temperature", 1e6), ("temperature", float("inf")), ("temperature", float("nan")),
           ("top_p", -0.5), ("top_p", 2.0), ("top_p", float("nan")), ("top_k", -3), ("min_p", 1.5),
           ("min_p", float("nan")), ("max_new_tokens", -1), ("max_new_tokens", 0), ("draft_tokens", -2),
           ("draft_tokens", 10**9), ("speculation", "bogus"), ("temperature", "hot"), ("top_k", None),
           ("seed", "x")]


def params_check(engine, trials: int, seed: int, say: Callable[[str], None]) -> dict[str, Any]:
    from ..engine.events import consume
    from ..engine.params import GenerationParams

    rng = random.Random(seed)
    crashes: list[str] = []
    done: Counter[str] = Counter()
    for trial in range(trials):
        field, value = rng.choice(INVALID)
        params = GenerationParams(temperature=0.7, max_new_tokens=24, seed=trial, speculation="auto")
        first = threading.Event()
        after = rng.randrange(0, 6)  # set it after this many text deltas

        def disturb(params=params, field=field, value=value, first=first) -> None:
            first.wait(120)
            setattr(params, field, value)

        setter = threading.Thread(target=disturb, daemon=True)
        setter.start()
        reason = None

        def release_setter(_ev, so_far, after=after, first=first) -> None:
            if so_far.deltas > after:
                first.set()

        try:
            reply = consume(engine.session().reply([{"role": "user", "content": "Count to twenty."}], params,
                                                   threading.Event()), release_setter)
            reason = reply.done.reason if reply.done else None
        except Exception as e:  # noqa: BLE001 (the figure: any exception out of reply() is a crash)
            crashes.append(f"{field}={value!r}: {type(e).__name__}: {e}")
        first.set()
        setter.join(10)
        done[str(reason)] += 1
    say(f"params: {trials} trials, {len(crashes)} crashes")
    return {"trials": trials, "crashes": len(crashes), "crash_examples": crashes[:5], "done": dict(done)}


# broken model files

def inputs_check(args: argparse.Namespace, root: Path, say: Callable[[str], None]) -> dict[str, Any]:
    cases = broken_inputs(root)
    # the control: the model every case breaks one thing of answers (so each error comes from that thing)
    control = subprocess.run(_generate_cmd(root / "good"), capture_output=True, text=True, timeout=args.case_timeout,
                             env={**os.environ, "HF_HUB_OFFLINE": "1"})
    say(f"inputs: control (unbroken) model: exit {control.returncode}")
    failures = []
    for name, ref, expected in cases:
        why, tail = _run_case(ref, expected, args.case_timeout)
        say(f"inputs: {name}: {'ok' if why is None else 'FAIL ' + why}")
        if why is not None:
            failures.append({"case": name, "why": why, "stderr_tail": tail})
    return {"cases": len(cases), "clear": len(cases) - len(failures), "failures": failures,
            "control_ok": control.returncode == 0}


FIX_WORDS = ("re-download", "download", "fix", "use ", "pass ", "delete", "pick", "move", "free", "run ")


def _generate_cmd(ref: Path) -> list[str]:
    return [sys.executable, "-m", "parley.app.cli", "generate", "hi", "--model", str(ref), "--quant", "none",
            "--max-new-tokens", "2", "--temperature", "0"]


def _run_case(ref: Path, expected: list[str], timeout: float) -> tuple[str | None, str]:
    cmd = _generate_cmd(ref)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout:.0f} s (a hang)", ""
    err = [line for line in out.stderr.replace("\r", "\n").splitlines() if line.strip()]
    tail = err[-1][:300] if err else ""
    if "Traceback" in out.stderr:
        return "a traceback", tail
    if out.returncode == 0:
        return "exit status 0", tail
    if not tail.startswith("parley: error:"):
        return "no one-line error", tail
    missing = [e for e in expected if e not in tail]
    if missing:
        return f"the message does not name {missing}", tail
    if not any(w in tail for w in FIX_WORDS):
        return "the message says nothing to do", tail
    return None, tail


def broken_inputs(root: Path) -> list[tuple[str, Path, list[str]]]:
    """(case, model ref, what the error must name) for every broken file this bench makes."""
    from ..models.resolve import embedded_model_path

    root.mkdir(parents=True, exist_ok=True)
    good = _tiny_model_dir(root / "good")
    cases: list[tuple[str, Path, list[str]]] = []

    def variant(name: str, change: Callable[[Path], Any], *expected: str) -> None:
        d = root / name
        shutil.copytree(good, d)
        change(d)
        cases.append((name, d, [name, *expected]))

    def config(field: str, value: Any) -> Callable[[Path], None]:
        def change(d: Path) -> None:
            cfg = json.loads((d / "config.json").read_text())
            cfg[field] = value
            (d / "config.json").write_text(json.dumps(cfg))
        return change

    def write(file: str, data: bytes | Callable[[bytes], bytes]) -> Callable[[Path], None]:
        def change(d: Path) -> None:
            path = d / file
            path.write_bytes(data(path.read_bytes()) if callable(data) else data)
        return change

    for field, value in [("intermediate_size", 10**13), ("vocab_size", 10**12), ("max_position_embeddings", -5),
                         ("hidden_size", -64), ("hidden_size", "64"), ("num_attention_heads", 0),
                         ("num_hidden_layers", 10_000_000), ("vocab_size", 100_000), ("intermediate_size", 4096),
                         ("rms_norm_eps", "tiny"), ("rope_scaling", {"rope_type": "yarn", "factor": 4.0})]:
        sized = field in ("vocab_size", "intermediate_size") and value <= LIMIT_HINT  # fails against the weights
        variant(f"config-{field}-{str(value)[:12]}", config(field, value), "shape" if sized else field)
    variant("config-list", write("config.json", b"[1, 2, 3]"), "config.json")
    variant("config-garbage", write("config.json", b"{not json"), "config.json")
    variant("config-truncated", write("config.json", lambda b: b[: len(b) // 2]), "config.json")
    for keep in (4, 100, -1000):
        variant(f"safetensors-cut{keep}", write("model.safetensors", lambda b, k=keep: b[:k]), "model.safetensors")
    variant("safetensors-garbage", write("model.safetensors", os.urandom(4096)), "model.safetensors")
    variant("safetensors-pickle-only", lambda d: ((d / "model.safetensors").unlink(),
                                                  (d / "pytorch_model.bin").write_bytes(b"pickle")), "safetensors")
    variant("tokenizer-garbage", write("tokenizer.json", b"{not json"), "tokenizer.json")
    variant("tokenizer-truncated", write("tokenizer.json", lambda b: b[: len(b) // 3]), "tokenizer.json")
    variant("tokenizer-config-garbage", write("tokenizer_config.json", b"{oops"), "tokenizer_config.json")
    variant("tokenizer-missing", lambda d: (d / "tokenizer.json").unlink(), "tokenizer")
    variant("tokenizer-empty-vocab", write("tokenizer.json", json.dumps(EMPTY_TOKENIZER).encode()), "vocabulary")
    variant("tokenizer-added-tokens-decoder", lambda d: (
        (d / "tokenizer.json").unlink(), (d / "tokenizer.model").write_bytes(b"sentencepiece"),
        (d / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": {"0": "oops"}}))),
        "tokenizer_config.json", "added_tokens_decoder")
    variant("index-json-list", write("model.safetensors.index.json", b'{"weight_map": ["a"]}'),
            "model.safetensors.index.json", "weight_map")
    variant("config-head_dim-33", config("head_dim", 33), "config.json", "head_dim")
    for tensor, dtype, words in [("model.embed_tokens.weight", "I32", "int32"), ("model.norm.weight", "BOOL", "bool"),
                                 ("model.layers.1.mlp.up_proj.weight", "NaN", "NaN")]:
        variant(f"weights-{tensor.split('.')[-2]}-{dtype}", lambda d, t=tensor, k=dtype: _retype(d, t, k),
                tensor.removeprefix("model."), words)

    def template(source: str) -> Callable[[Path], None]:
        def change(d: Path) -> None:
            cfg = json.loads((d / "tokenizer_config.json").read_text())
            (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": source}))
        return change

    variant("template-huge", template("x" * (2 << 20)), "chat template")
    variant("template-syntax", template("{% for %}"), "chat template")
    variant("template-nested-loops", template(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"), "chat template")
    variant("template-escape", template("{{ ''.__class__.__mro__[1].__subclasses__() }}"), "chat template")
    variant("template-repeat", template("{{ 'x' * 10000000000 }}"), "chat template")
    variant("template-doubling", template("{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
                                          "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}"), "chat template")
    variant("template-zfill", template("{{ 'a'.zfill(10000000000) }}"), "chat template")
    # issue 36: values of the wrong JSON type, deep nesting, text built from a nested value, a mislabelled folder
    variant("template-nested-list", template("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}"
                                             "{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}"), "chat template")
    variant("template-star-width", template("{{ '%*d' % (10000000000, 1) }}"), "chat template")
    variant("config-model_type-list", config("model_type", ["llama"]), "model_type")
    variant("config-model_type-object", config("model_type", {"name": "llama"}), "model_type")

    def gemma(**fields: Any) -> Callable[[Path], None]:
        return lambda d: [config(k, v)(d) for k, v in {"model_type": "gemma3_text", **fields}.items()]

    variant("config-layer_types-object", gemma(layer_types={"0": "full_attention"}), "layer_types")
    variant("config-layer_types-lists", gemma(layer_types=[["full_attention"], [1]]), "layer_types")
    variant("config-sliding_window_pattern-0", gemma(sliding_window_pattern=0), "sliding_window_pattern")
    variant("config-sliding_window_pattern-text", gemma(sliding_window_pattern="6"), "sliding_window_pattern")
    variant("config-rope-llama3-without-factors", config("rope_scaling", {"rope_type": "llama3", "factor": 8.0}),
            "original_max_position_embeddings")
    variant("config-nested-100000", write("config.json", b"[" * 100_000 + b"]" * 100_000), "config.json")
    variant("awq-without-qweight", config("quantization_config", {"quant_method": "awq", "bits": 4, "group_size": 32,
                                                                 "version": "gemm", "zero_point": True}), "qweight")

    gguf = embedded_model_path().read_bytes()
    for name, data in [("gguf-cut3", gguf[:3]), ("gguf-cut100", gguf[:100]), ("gguf-cut5000", gguf[:5000]),
                       ("gguf-cut-half", gguf[: len(gguf) // 2]), ("gguf-magic", b"GGUX" + gguf[4:2_000_000]),
                       ("gguf-random", os.urandom(100_000))]:
        path = root / f"{name}.gguf"
        path.write_bytes(data)
        cases.append((name, path, [path.name]))
    for key, value, shown in [("llama.context_length", 0, "context_length"),
                              ("llama.attention.head_count", 0, "head_count"),
                              ("llama.block_count", 10_000_000, "block_count")]:
        path = root / f"gguf-{key.split('.')[-1]}.gguf"
        path.write_bytes(_patch_u32(gguf, key, value))
        cases.append((path.stem, path, [path.name, shown]))
    for name, data in [("gguf-kv-2^40", gguf[:16] + struct.pack("<Q", 1 << 40) + gguf[24:]),
                       ("gguf-tensors-2^40", gguf[:8] + struct.pack("<Q", 1 << 40) + gguf[16:]),
                       ("gguf-tokens-2^40", _patch_array_count(gguf, "tokenizer.ggml.tokens", 1 << 40)),
                       ("gguf-token_type-2^40", _patch_array_count(gguf, "tokenizer.ggml.token_type", 1 << 40))]:
        path = root / f"{name}.gguf"
        path.write_bytes(data)
        cases.append((name, path, [path.name, "claims"]))  # refused at the count, before reading entries
    return cases


def _patch_array_count(gguf: bytes, key: str, count: int) -> bytes:
    """The GGUF with the metadata array `key` claiming `count` entries (its data left as it is)."""
    name = key.encode()
    at = gguf.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    if struct.unpack_from("<I", gguf, at)[0] != 9:
        raise ValueError(f"{key} is not an array in the embedded GGUF")
    return gguf[: at + 8] + struct.pack("<Q", count) + gguf[at + 16 :]


LIMIT_HINT = 1 << 22  # config sizes above this fail as out of bounds; below, against the weights' shapes
EMPTY_TOKENIZER = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
                   "pre_tokenizer": None, "post_processor": None, "decoder": None,
                   "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": {},
                             "merges": []}}


def _retype(d: Path, name: str, dtype: str) -> None:
    """Rewrite one tensor of model.safetensors as `dtype` (I32 or BOOL, same element count), or fill it with
    NaN ("NaN"), keeping the file valid safetensors."""
    raw = (d / "model.safetensors").read_bytes()
    n = struct.unpack_from("<Q", raw)[0]
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    blobs = {k: data[v["data_offsets"][0] : v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}
    count = len(blobs[name]) // 4
    if dtype == "NaN":
        blobs[name] = array("f", [float("nan")] * count).tobytes()
    else:
        header[name]["dtype"] = dtype
        blobs[name] = bytes(count) if dtype == "BOOL" else array("i", [1] * count).tobytes()
    offset, parts = 0, []
    for k in blobs:
        header[k]["data_offsets"] = [offset, offset + len(blobs[k])]
        offset += len(blobs[k])
        parts.append(blobs[k])
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + b"".join(parts))


def _patch_u32(gguf: bytes, key: str, value: int) -> bytes:
    """The GGUF with metadata `key` (a UINT32) set to `value`."""
    name = key.encode()
    at = gguf.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    kind = struct.unpack_from("<I", gguf, at)[0]
    if kind != 4:
        raise ValueError(f"{key} is not a UINT32 in the embedded GGUF")
    return gguf[: at + 4] + struct.pack("<I", value) + gguf[at + 8 :]


def _tiny_model_dir(out: Path, seed: int = 0) -> Path:
    """A 2-layer llama with small random weights (norms 1) and the embedded model's tokenizer, written by
    hand as safetensors (a JSON header and raw bytes) so this bench builds its cases without tensors."""
    from ..models.quantize.cache import tokenizer_files
    from ..models.resolve import resolve

    out.mkdir(parents=True)
    tokenizer_files(resolve(None), out)
    vocab = 1 + max(json.loads((out / "tokenizer.json").read_text())["model"]["vocab"].values())
    dim, inter, kv = 64, 128, 32
    shapes = {"model.embed_tokens.weight": [vocab, dim], "model.norm.weight": [dim]}
    for i in range(2):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": [dim], p + "post_attention_layernorm.weight": [dim],
                       p + "self_attn.q_proj.weight": [dim, dim], p + "self_attn.k_proj.weight": [kv, dim],
                       p + "self_attn.v_proj.weight": [kv, dim], p + "self_attn.o_proj.weight": [dim, dim],
                       p + "mlp.gate_proj.weight": [inter, dim], p + "mlp.up_proj.weight": [inter, dim],
                       p + "mlp.down_proj.weight": [dim, inter]})
    rng = random.Random(seed)
    header, data, offset = {}, [], 0
    for name, shape in shapes.items():
        count = shape[0] * (shape[1] if len(shape) > 1 else 1)
        values = array("f", [1.0] * count) if len(shape) == 1 else \
            array("f", [rng.gauss(0.0, 0.05) for _ in range(count)])
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + 4 * count]}
        data.append(values.tobytes())
        offset += 4 * count
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(out / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.writelines(data)
    config = {"model_type": "llama", "vocab_size": vocab, "hidden_size": dim, "intermediate_size": inter,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": True}
    (out / "config.json").write_text(json.dumps(config))
    return out
