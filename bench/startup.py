"""Start-up time on a cached model: the chat app to a prompt that takes typing, to a loaded engine and to the
first token of an answer; `parley generate` to its answer. Each run is a fresh process, timed from before it
is spawned, so the interpreter's own start and every import count as a user waits for them.

Why a bench and not a test: a start is a wall-clock figure, and these machines are shared; the figures are
read against each other within one run. One unmeasured start goes first, so every cache (the INT4 folder,
the native library and its packed layout, the tokenizer) exists and the measured runs are cached starts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..app.first_run import CHOICE_KEY, model_key  # app: the first run's remembered answer
from .harness import add_json_argument, emit, median

QUESTION = "What is the capital of France?"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model ref (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--runs", type=int, default=3, help="measured starts of each kind (median)")
    add_json_argument(p)


def _spawn(argv: list[str], data: str) -> tuple[float, str]:
    """Run `argv` in a fresh interpreter with its own data and config folders (the user's history and settings
    stay untouched; the cache is the user's, so the start is cached); (seconds to exit, its stdout)."""
    env = {**os.environ, "PARLEY_DATA_DIR": os.path.join(data, "data"),
           "PARLEY_CONFIG_DIR": os.path.join(data, "config"), "PARLEY_BENCH_T0": repr(time.time())}
    start = time.perf_counter()
    run = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=900)
    seconds = time.perf_counter() - start
    if run.returncode != 0:
        raise SystemExit(f"bench startup: {' '.join(argv)} failed:\n{run.stderr[-2000:]}")
    return seconds, run.stdout


def _generate_argv(model: str | None) -> list[str]:
    return ["-m", "parley.app.cli", "generate", *(["--model", model] if model else []), "--temperature", "0",
            "--max-new-tokens", "16", QUESTION]


def _chat_argv(model: str | None) -> list[str]:
    return ["-m", "parley.bench.startup", *(["--model", model] if model else [])]


def run(args: argparse.Namespace) -> int:
    results: dict[str, Any] = {"model": args.model or "the embedded SmolLM2-135M-Instruct", "runs": args.runs,
                               "load_average_1min": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="parley-startup-") as data:
        # a returning user's settings: the first run's question (a 4-bit .gguf: its own weights, or Parley's
        # INT4?) answered "awq", so the app starts on the cached INT4 model as `generate` does
        config = Path(data, "config")
        config.mkdir()
        (config / "settings.json").write_text(json.dumps({CHOICE_KEY: {model_key(args.model): "awq"}}))
        _spawn(_generate_argv(args.model), data)  # caches in place
        generate, chat = [], []
        for _ in range(args.runs):  # interleaved, so a change of load falls on both
            generate.append(_spawn(_generate_argv(args.model), data)[0])
            chat.append(json.loads(_spawn(_chat_argv(args.model), data)[1].strip().splitlines()[-1]))
    results["generate_s"] = round(median(generate), 3)
    results["generate_runs_s"] = [round(s, 3) for s in generate]
    for key in ("prompt_s", "engine_s", "first_token_s"):
        results[f"chat_{key}"] = round(median(r[key] for r in chat), 3)
    results["chat_runs"] = chat
    results["load_average_1min_after"] = round(os.getloadavg()[0], 2)
    return emit(results, args.json, _lines)


def _lines(r: dict[str, Any]) -> list[str]:
    return [f"cached start of {r['model']}, median of {r['runs']} fresh processes "
            f"(load average {r['load_average_1min']} -> {r['load_average_1min_after']}):",
            f"  parley (chat app): a prompt that takes typing {r['chat_prompt_s']:.2f} s, the engine loaded "
            f"{r['chat_engine_s']:.2f} s, the first token of an answer {r['chat_first_token_s']:.2f} s",
            f"  parley generate --max-new-tokens 16 \"{QUESTION}\": {r['generate_s']:.2f} s to exit"]


def _probe(argv: list[str]) -> None:
    """The chat app, headless: when its prompt first has focus on the chat screen, when the engine is in, and
    when the first token of an answer shows; seconds since PARLEY_BENCH_T0, one JSON line on stdout."""
    t0 = float(os.environ["PARLEY_BENCH_T0"])
    from parley.app import tui

    parser = argparse.ArgumentParser()
    tui.add_arguments(parser)
    args = parser.parse_args(argv)
    marks: dict[str, float] = {}

    async def until(predicate, interval: float = 0.01) -> None:
        while not predicate():
            await asyncio.sleep(interval)

    async def main() -> None:
        app = tui.build_app(args)
        async with app.run_test(size=(100, 30)) as pilot:
            await until(lambda: _prompt_ready(app))
            marks["prompt_s"] = time.time() - t0
            await until(lambda: app.engine is not None and app.engines.loading is None)
            marks["engine_s"] = time.time() - t0
            app.prompt.focus()  # as a user's click would: the engine's arrival may have moved it
            app.prompt.load_text(QUESTION)
            await pilot.press("enter")
            await until(lambda: len(app.chat.messages) >= 2 and bool(app.chat.messages[-1].content))
            marks["first_token_s"] = time.time() - t0
            print(json.dumps({k: round(v, 3) for k, v in marks.items()}), flush=True)
            os._exit(0)  # measured: neither the rest of the reply nor the app's teardown is part of a start

    asyncio.run(main())


def _prompt_ready(app) -> bool:
    try:
        return app.screen is app.chat_screen and app.prompt.has_focus
    except Exception:  # not mounted yet
        return False


if __name__ == "__main__":
    _probe(sys.argv[1:])
