"""`parley`: the chat app by default, plus headless `generate`, `quantize` and `bench` commands."""

from __future__ import annotations

import argparse
import ast
import errno
import importlib
import importlib.util
import os
import re
import sys
import time
from pathlib import Path

# Subcommands implemented in their own modules (`add_arguments(parser)`, `run(args) -> int`), named under `parley`:
# the `parley bench` commands are the `bench` package's, reached only by name, so that app never imports bench.
BENCHES = {
    "decode": "bench.decode",
    "faults": "bench.faults",
    "gpu": "bench.gpu",
    "kernels": "bench.kernels",
    "passes": "bench.passes",
    "quality": "bench.quality",
    "serve": "bench.serve",
    "speculative": "bench.speculative",
    "startup": "bench.startup",
}


def _module(name: str):
    return importlib.import_module(f"parley.{name}")


def _summary(name: str) -> str:
    """A module's first docstring line, read without importing it (benches import torch)."""
    spec = importlib.util.find_spec(f"parley.{name}")
    try:
        text = Path(spec.origin).read_text(encoding="utf-8") if spec else ""
        head = re.match(r'\s*(?:#[^\n]*\n\s*)*[rRuU]?(?:"""|\'\'\').*?(?:"""|\'\'\')', text, re.S)  # the docstring only
        doc = ast.get_docstring(ast.parse(head.group(0))) if head else None
    except (OSError, SyntaxError, ValueError):
        doc = None
    return (doc or "").strip().splitlines()[0] if doc else ""


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="hub id (org/name[@rev]), local directory or .gguf file; default: this machine's default")
    p.add_argument("--quant", choices=("awq", "gguf", "none"), default="awq",
                   help="awq: Parley's INT4, quantized and cached on first use (default); gguf: a .gguf file's own "
                        "4-bit weights (Q4_0/Q4_1/Q4_K) on the INT4 kernels at once, nothing quantized; none: the "
                        "weights as they are")
    p.add_argument("--draft", default=None, help="a draft model (same tokenizer) for speculative decoding")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--compile", action="store_true", default=None,
                   help="torch.compile the PyTorch decode step (CUDA, or CPU without the native step; "
                        "also PARLEY_COMPILE=1)")
    p.add_argument("--kv-cache", choices=("auto", "fp", "bf16", "int8", "k8v4"), default=None,
                   help="KV cache storage (also PARLEY_KV_CACHE); auto: int8 on CPU, the model's dtype on CUDA")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template to use instead of the model's own (or its family's default)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (also PARLEY_THREADS); default: all cores, fewer while the machine is busy")
    p.add_argument("--parallel", type=int, default=None, metavar="N",
                   help="replies decoded together, each in its own KV slot of a whole context window (also "
                        "PARLEY_PARALLEL); more wait for a slot; default: what a quarter of the free memory holds, "
                        "1 to 8")


# Sampling flags: (name, type, default, help). Defaults are applied by `params_from_args`, so the chat
# app can tell a flag given on the command line (it wins) from one left out (the saved value is kept).
SAMPLING_FLAGS = (
    ("temperature", float, 0.7, "0 = greedy"),
    ("top_p", float, 0.95, "1 = off"),
    ("top_k", int, 0, "0 = off"),
    ("min_p", float, 0.0, "0 = off"),
    ("repeat_penalty", float, 1.0, "divide the logits of recent tokens by this (llama.cpp); 1 = off"),
    ("repeat_last_n", int, 64, "how many recent tokens the repeat penalty looks at"),
    ("frequency_penalty", float, 0.0, "subtract this times each token's count so far (OpenAI); 0 = off"),
    ("presence_penalty", float, 0.0, "subtract this from every token seen so far (OpenAI); 0 = off"),
    ("max_new_tokens", int, 512, ""),
    ("seed", int, None, "fixed seed for reproducible sampling"),
    ("draft_tokens", int, 16, "upper bound of the draft length"),
)

MODEL_RECOMMENDS = ("temperature", "top_p", "top_k", "min_p")  # models/sampling_defaults.py


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    for name, kind, default, text in SAMPLING_FLAGS:
        said = f"the model's recommended value, else {default}" if name in MODEL_RECOMMENDS else default
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None,
                       help=f"{text}{'; ' if text else ''}default: {said}")
    p.add_argument("--speculation", choices=("off", "prompt-lookup", "suffix", "suffix-tree", "draft", "auto"),
                   default=None, help="default: auto")


def params_from_args(args: argparse.Namespace, base=None):
    """GenerationParams from `base` (default: the defaults) with the flags given on the command line."""
    import copy

    from ..engine.params import GenerationParams

    params = copy.copy(base) if base is not None else GenerationParams()
    for name, _, default, _ in (*SAMPLING_FLAGS, ("speculation", str, "auto", "")):
        value = getattr(args, name, None)
        if value is not None:
            setattr(params, name, value)
        elif not hasattr(params, name):  # a field this engine version does not have yet
            setattr(params, name, default)
    params.validate()
    return params


def print_progress(p) -> None:
    """First-run progress on stderr for headless commands. On a terminal, one line rewritten in place (cleared,
    not padded: padding wraps a narrow terminal); anywhere else (a log, a pipe, `2>&1`), each step on a line of
    its own, so no unended line runs into the answer or an error."""
    global _progress_open, _progress_last
    if p.stage == "download" and p.total:
        msg = f"downloading {p.detail} {p.done / 1e6:.1f}/{p.total / 1e6:.1f} MB"
    else:
        msg = f"{p.stage}: {p.detail or f'{p.done:g}/{p.total:g} {p.unit}'}"
    done = bool(p.total and p.done >= p.total)
    if sys.stderr.isatty():
        print(f"\r\033[K{msg[:100]}", end="\n" if done else "", file=sys.stderr, flush=True)
        _progress_open = not done
        return
    # A line per step, not per chunk or layer (those at most every 10 s): its figures aside, what it says.
    step = (p.stage, re.sub(r"\d+", "#", p.detail), done, time.monotonic() // 10)
    if step != _progress_last:
        _progress_last = step
        print(msg, file=sys.stderr, flush=True)


_progress_open = False  # a progress line was printed on a terminal without its newline
_progress_last: tuple = ()


def end_progress() -> None:
    """End an open progress line, so that what follows (the answer, a notice, --stats) starts on its own line."""
    global _progress_open
    if _progress_open:
        print(file=sys.stderr, flush=True)
        _progress_open = False


# -- remote: an OpenAI-compatible server instead of the in-process engine (issue 11) ---------------------


def add_remote_arguments(p: argparse.ArgumentParser) -> None:
    """--server URL switches to the remote backend; --model then names the served model."""
    p.add_argument("--server", default=os.environ.get("PARLEY_SERVER"),
                   help="an OpenAI-compatible endpoint such as http://host:8000/v1 (vLLM, SGLang, llama-server, "
                        "Ollama, parley serve); also PARLEY_SERVER")
    p.add_argument("--api-key-file", default=None, metavar="FILE",
                   help="the bearer token for --server is this file's first line (or set PARLEY_API_KEY or "
                        "OPENAI_API_KEY; never stored)")
    p.add_argument("--api-key", default=None, help=argparse.SUPPRESS)  # refused: argv is visible in `ps`
    p.add_argument("--tokenizer", default=None,
                   help="with --server: the served model's tokenizer (hub id, directory or .gguf), so a slider "
                        "moved mid-reply can continue it through /v1/completions")
    p.add_argument("--context-window", type=int, default=None,
                   help="with --server: the context length, when the server does not tell it")


# -- the parser ------------------------------------------------------------------------------------------


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; of the subcommands in their own modules, only the one `argv` runs is imported (all of
    them when `argv` is None), so `parley --help` stays free of torch."""
    parser = argparse.ArgumentParser(prog="parley", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    commands = {"chat": "app.tui", "generate": "app.generate", "quantize": "app.cli_quantize",
                "web": "app.server.web", "serve": "app.server.api"}
    wanted = None if argv is None else commands.get(argv[0] if argv else "")
    if argv is not None and len(argv) > 1 and argv[0] == "bench":
        wanted = BENCHES.get(argv[1])

    add_module_command(sub, "chat", "app.tui", "open the chat app (the default)",
                       load=argv is None or wanted == "app.tui")

    add_module_command(sub, "generate", "app.generate", "answer one prompt headlessly, streaming to stdout",
                       load=argv is None or wanted == "app.generate")

    add_module_command(sub, "web", "app.server.web", "serve the chat app in a browser (127.0.0.1)",
                       load=argv is None or wanted == "app.server.web")
    add_module_command(sub, "quantize", "app.cli_quantize", "AWQ-quantize a model into the Parley cache",
                       load=argv is None or wanted == "app.cli_quantize")
    add_module_command(sub, "serve", "app.server.api", "serve the local engine as an OpenAI-compatible HTTP API",
                       load=argv is None or wanted == "app.server.api")
    bench = sub.add_parser("bench", help="print speed / quality / reliability figures")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    for name, module in BENCHES.items():
        add_module_command(bench_sub, name, module, load=argv is None or wanted == module)
    return parser


def add_module_command(sub, name: str, module: str, help: str | None = None, load: bool = True) -> None:
    if not load:  # listed with its summary; imported only when it runs
        sub.add_parser(name, help=help or _summary(module))
        return
    try:
        mod = _module(module)
    except ImportError as e:  # a command whose optional dependency is missing stays listed, with why
        sub.add_parser(name, help=f"(unavailable: {e})").set_defaults(unavailable=str(e))
        return
    p = sub.add_parser(name, help=help or (mod.__doc__ or "").strip().splitlines()[0])
    mod.add_arguments(p)
    p.set_defaults(module=mod)


def device_problem(name: str | None) -> str | None:
    """Why `--device name` cannot be used on this machine, or None ("auto": whatever this machine has)."""
    if not name or name == "auto":
        return None
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        return f"--device {name}: not a device PyTorch knows; use cpu or cuda"
    if device.type not in ("cpu", "cuda"):
        return f"--device {name}: Parley runs on cpu or cuda, not {device.type}"
    if device.type == "cuda" and not torch.cuda.is_available():
        build = "has no CUDA support" if torch.version.cuda is None else "sees no CUDA GPU"
        return f"--device {name}: this PyTorch build {build}; use --device cpu"
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        return f"--device {name}: there are {torch.cuda.device_count()} CUDA device(s); use cuda:0"
    return None


def finish_cache_writes(cancel: bool = False) -> None:
    """A CPU layout still being written for the next start (models/native_cache.save_later) is waited for here,
    and said, rather than silently by the interpreter on its way out; after Ctrl-C it is given up instead."""
    cache = sys.modules.get("parley.models.native_cache")  # not imported: nothing is being written
    if cache is None or not cache.pending_saves():
        return
    if cancel:
        cache.cancel_saves()
        return
    end_progress()
    print("parley: writing the CPU layout for the next start (Ctrl-C skips it; that start packs again)",
          file=sys.stderr)
    try:
        cache.wait_for_saves()
    except KeyboardInterrupt:
        cache.cancel_saves()
        raise


def main(argv: list[str] | None = None) -> int:
    """Run a command; bad input, Ctrl-C, a full disk and an unusable device end in one line, not a traceback.
    However it ends, a CPU layout still being written is said and waited for (or given up after Ctrl-C)."""
    try:
        code = _command(argv)
    except BaseException:  # a traceback on its way: the write still lands, and is said
        _finish_writes()
        raise
    if not _finish_writes():
        print("parley: interrupted (nothing half-written is kept)", file=sys.stderr)
        return 130
    return code


def _finish_writes() -> bool:
    """`finish_cache_writes` as a command ends; False where Ctrl-C gave the write up (wherever it landed)."""
    try:
        finish_cache_writes()
        return True
    except KeyboardInterrupt:
        finish_cache_writes(cancel=True)
        return False


def _command(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["chat", *argv]
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        problem = device_problem(getattr(args, "device", None))
        if problem:
            print(f"parley: error: {problem}", file=sys.stderr)
            return 2
        if args.command in ("chat", "generate", "web", "quantize", "bench", "serve"):
            if getattr(args, "unavailable", None):
                parser.error(f"{' '.join(argv[:2])} is unavailable: {args.unavailable}")
            return args.module.run(args)
    except ValueError as e:  # bad input: the message names the value and the fix
        end_progress()  # on its own line, not after "load: reading the weights…"
        print(f"parley: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        end_progress()
        finish_cache_writes(cancel=True)
        print("parley: interrupted (nothing half-written is kept)", file=sys.stderr)
        return 130
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        end_progress()
        where = f" writing {e.filename}" if e.filename else ""
        print(f"parley: error: the disk is full{where}; free some space and run again", file=sys.stderr)
        return 1
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
