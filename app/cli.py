"""`parley`: the chat app by default, plus headless `generate`, `quantize` and `bench` commands."""

from __future__ import annotations

import argparse
import ast
import errno
import importlib
import importlib.util
import json
import sys
import threading
from pathlib import Path

# Subcommands implemented in their own modules (`add_arguments(parser)`, `run(args) -> int`).
BENCHES = {
    "decode": "bench_decode",
    "faults": "bench_faults",
    "kernels": "bench_kernels",
    "quality": "bench_quality",
    "speculative": "bench_speculative",
}


def _module(name: str):
    return importlib.import_module(f"parley.app.{name}")


def _summary(name: str) -> str:
    """A module's first docstring line, read without importing it (benches import torch)."""
    spec = importlib.util.find_spec(f"parley.app.{name}")
    try:
        doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))) if spec else None
    except (OSError, SyntaxError, ValueError):
        doc = None
    return (doc or "").strip().splitlines()[0] if doc else ""


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="hub id (org/name[@rev]), local directory or .gguf file; default: this machine's default")
    p.add_argument("--quant", choices=("awq", "none"), default="awq",
                   help="awq: INT4, quantized and cached on first use (default); none: the weights as they are")
    p.add_argument("--draft", default=None, help="a draft model (same tokenizer) for speculative decoding")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--compile", action="store_true", default=None,
                   help="torch.compile the decode step: ~1.2x faster INT4 decode on CPU after a ~1 min compile "
                        "(also PARLEY_COMPILE=1)")


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.7, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--min-p", type=float, default=0.0, help="0 = off")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--speculation", choices=("off", "prompt-lookup", "draft", "auto"), default="auto")
    p.add_argument("--draft-tokens", type=int, default=8, help="upper bound of the adaptive draft length")


def params_from_args(args: argparse.Namespace):
    from ..engine.params import GenerationParams

    params = GenerationParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
        max_new_tokens=args.max_new_tokens, seed=args.seed, speculation=args.speculation,
        draft_tokens=args.draft_tokens,
    )
    params.validate()
    return params


def print_progress(p) -> None:
    """First-run progress on stderr for headless commands."""
    if p.stage == "download" and p.total:
        msg = f"downloading {p.detail} {p.done / 1e6:.1f}/{p.total / 1e6:.1f} MB"
    else:
        msg = f"{p.stage}: {p.detail or f'{p.done:g}/{p.total:g} {p.unit}'}"
    print(f"\r{msg[:100]:<100}", end="\n" if p.total and p.done >= p.total else "", file=sys.stderr, flush=True)


def cmd_generate(args: argparse.Namespace) -> int:
    from ..engine.engine import Engine
    from ..engine.events import Done, Stats, TextDelta

    params = params_from_args(args)
    engine = Engine.load(args.model, quant=args.quant, draft=args.draft, device=args.device,
                         progress=print_progress, compile=args.compile)
    messages = [{"role": "user", "content": args.prompt}]
    session = engine.session(system_prompt=args.system)
    stats, done = None, None
    try:
        for ev in session.reply(messages, params, threading.Event()):
            if isinstance(ev, TextDelta):
                sys.stdout.write(ev.text)
                sys.stdout.flush()
            elif isinstance(ev, Stats):
                stats = ev
            elif isinstance(ev, Done):
                done = ev
    except KeyboardInterrupt:
        return 130
    sys.stdout.write("\n")
    sys.stdout.flush()
    if args.stats and stats is not None:
        print(json.dumps({**stats.to_json(), "done": done.reason if done else None}), file=sys.stderr)
    if done is not None and done.reason == "error":
        print(f"parley: error: {done.detail}", file=sys.stderr)
        return 1
    if done is not None and done.reason == "length" and "context window" in done.detail:
        print(f"parley: {done.detail}", file=sys.stderr)
    return 0


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; of the subcommands in their own modules, only the one `argv` runs is imported (all of
    them when `argv` is None), so `parley --help` stays free of torch."""
    parser = argparse.ArgumentParser(prog="parley", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    wanted = None if argv is None else {"chat": "tui", "quantize": "cli_quantize"}.get(argv[0] if argv else "")
    if argv is not None and len(argv) > 1 and argv[0] == "bench":
        wanted = BENCHES.get(argv[1])

    add_module_command(sub, "chat", "tui", "open the chat app (the default)", load=argv is None or wanted == "tui")

    gen = sub.add_parser("generate", help="answer one prompt headlessly, streaming to stdout")
    gen.add_argument("prompt")
    gen.add_argument("--system", default=None, help="system prompt")
    gen.add_argument("--stats", action="store_true", help="print final stats as one JSON line on stderr")
    add_model_arguments(gen)
    add_sampling_arguments(gen)

    add_module_command(sub, "quantize", "cli_quantize", "AWQ-quantize a model into the Parley cache",
                       load=argv is None or wanted == "cli_quantize")
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
    """Why `--device name` cannot be used on this machine, or None."""
    if not name:
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


def main(argv: list[str] | None = None) -> int:
    """Run a command; bad input, Ctrl-C, a full disk and an unusable device end in one line, not a traceback."""
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
        if args.command == "generate":
            return cmd_generate(args)
        if args.command in ("chat", "quantize", "bench"):
            if getattr(args, "unavailable", None):
                parser.error(f"{' '.join(argv[:2])} is unavailable: {args.unavailable}")
            return args.module.run(args)
    except ValueError as e:  # bad input: the message names the value and the fix
        print(f"parley: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("parley: interrupted (nothing half-written is kept)", file=sys.stderr)
        return 130
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f" writing {e.filename}" if e.filename else ""
        print(f"parley: error: the disk is full{where}; free some space and run again", file=sys.stderr)
        return 1
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
