"""Command-line flags -> an engine: the one path `generate`, `chat`, `serve` and `bench decode` load through.

The model flags (`cli.add_model_arguments`) and `--server` (`cli.add_remote_arguments`) are read here and
nowhere else, so a flag added there reaches every command that loads a model.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def engine_from_args(args: argparse.Namespace, *, progress=None, **overrides: Any):
    """The engine the flags name: the remote backend with `--server`, else `Engine.load` with the model
    flags (`overrides` replace single keywords, e.g. `quant=` for the first run's unquantized start)."""
    from . import cli

    progress = progress or cli.print_progress
    if getattr(args, "server", None):  # an OpenAI-compatible server instead of the in-process engine
        return connect_remote(args, progress)
    from ..engine.engine import Engine

    options: dict[str, Any] = {
        "quant": getattr(args, "quant", "awq"),
        "draft": getattr(args, "draft", None),
        "device": getattr(args, "device", None) or None,
        "compile": getattr(args, "compile", None),
        "kv_cache": getattr(args, "kv_cache", None),  # auto / None: PARLEY_KV_CACHE, else the device's default
        "threads": getattr(args, "threads", None),
        "parallel": getattr(args, "parallel", None),
        "chat_template": getattr(args, "chat_template", None),
        "progress": progress,
    }
    options.update(overrides)
    return Engine.load(getattr(args, "model", None), **options)


def connect_remote(args: argparse.Namespace, progress=None):
    """The remote backend from the flags; ValueError (printed as `parley: error: ...`) says what to fix."""
    from ..engine.remote import RemoteEngine, insecure_warning
    from .server.keys import api_key as read_key

    api_key = read_key(args, env=("PARLEY_API_KEY", "OPENAI_API_KEY"))
    warning = insecure_warning(args.server)
    if warning:
        print(f"parley: warning: {warning}", file=sys.stderr)
    tokenizer = None
    if args.tokenizer:
        from ..models.resolve import resolve
        from ..models.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(resolve(args.tokenizer, progress=progress))
    return RemoteEngine.connect(args.server, api_key=api_key, model=args.model, tokenizer=tokenizer,
                                context_window=args.context_window)
