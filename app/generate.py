"""`parley generate`: answer one prompt headlessly, streaming to stdout."""

from __future__ import annotations

import argparse
import json
import sys
import threading

from . import cli


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", nargs="?", default=None,
                        help="the question; '-' or left out with a pipe: read it from stdin")
    parser.add_argument("--file", default=None, metavar="PATH",
                        help="attach a text file: it is sent before the prompt (as llama-cli's /read)")
    parser.add_argument("--system", default=None, help="system prompt")
    parser.add_argument("--raw", action="store_true",
                        help="continue the prompt text as written: no chat template (base models, completion)")
    parser.add_argument("--stats", action="store_true", help="print final stats as one JSON line on stderr")
    cli.add_model_arguments(parser)
    cli.add_sampling_arguments(parser)
    cli.add_remote_arguments(parser)


def read_prompt(args: argparse.Namespace, stdin=None) -> str:
    """The prompt: the argument, or stdin when it is `-` or absent and stdin is not a terminal; with
    the `--file` document before it (as the chat app sends an attachment)."""
    stdin = stdin if stdin is not None else sys.stdin
    prompt = args.prompt
    if prompt == "-" or (prompt is None and not stdin.isatty()):
        prompt = stdin.read()
    if prompt is None:
        raise ValueError("no prompt: give it as an argument, or pipe it in (echo 'question' | parley generate)")
    if args.file:
        from pathlib import Path

        from .store import compose_user_content

        path = Path(args.file).expanduser()
        try:
            document = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"--file {path}: not UTF-8 text") from None
        except OSError as e:
            raise ValueError(f"--file {path}: {e.strerror or e}") from None
        prompt = compose_user_content(prompt.strip(), document.replace("\r\n", "\n").replace("\r", "\n"))
    if not prompt.strip():
        raise ValueError("the prompt is empty: give a question as an argument or on stdin")
    return prompt


def run(args: argparse.Namespace) -> int:
    from ..engine.events import Notice, TextDelta, consume
    from .engine_from_args import engine_from_args

    params = cli.params_from_args(args)
    prompt = read_prompt(args)
    engine = engine_from_args(args, progress=cli.print_progress)
    for name, value in (getattr(engine, "sampling_defaults", None) or ({}, ""))[0].items():
        if getattr(args, name, None) is None:  # the model's recommended value unless a flag says otherwise
            setattr(params, name, value)
    messages = [{"role": "user", "content": prompt}]
    if args.raw:  # continue the text as written, as /v1/completions does (llama-cli -no-cnv)
        if args.system or getattr(args, "server", None):
            raise ValueError("--raw continues text with the local engine: it takes no --system or --server")
        session = engine.session(raw=True)
    else:
        session = engine.session(system_prompt=args.system)

    def show(ev, _reply) -> None:
        cli.end_progress()
        if isinstance(ev, TextDelta):
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        elif isinstance(ev, Notice):
            print(f"parley: {ev.text}", file=sys.stderr)

    try:
        reply = consume(session.reply(messages, params, threading.Event()), show)
    except KeyboardInterrupt:
        return 130
    stats, done, produced = reply.stats, reply.done, bool(reply.text)
    if produced and not reply.text.endswith("\n"):
        sys.stdout.write("\n")  # the output ends with a newline, before any --stats line
    sys.stdout.flush()
    if args.stats and stats is not None:
        print(json.dumps({**stats.to_json(), "done": done.reason if done else None}), file=sys.stderr)
    if done is not None and done.reason == "error":
        print(f"parley: error: {done.detail}", file=sys.stderr)
        return 1
    if done is not None and done.reason == "length" and "context" in done.detail:
        print(f"parley: error: {done.detail}", file=sys.stderr)
        return 3
    if not produced:
        print("parley: error: the model produced no text (try another prompt, a higher --max-new-tokens "
              "or --temperature)", file=sys.stderr)
        return 1
    return 0
