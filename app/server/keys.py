"""API keys: for `parley serve` (--api-key-file, PARLEY_API_KEY) and for the client of a remote server (--server's
key, also OPENAI_API_KEY). Read from a file or the environment, never from the command line, never written."""

from __future__ import annotations

import argparse
import os


def add_key_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """--api-key-file; --api-key only to say why not (a key on the command line is in `ps` and shell history)."""
    parser.add_argument("--api-key-file", default=None, metavar="FILE",
                        help=f"{what}: the key is this file's first line (or set PARLEY_API_KEY)")
    parser.add_argument("--api-key", default=None, help=argparse.SUPPRESS)


def api_key(args: argparse.Namespace, env: tuple[str, ...] = ("PARLEY_API_KEY",)) -> str | None:
    """The key from --api-key-file, else the first of `env` set; never from the command line, never written."""
    if getattr(args, "api_key", None) is not None:
        raise ValueError("--api-key: a key on the command line is visible to every user of this machine (ps, "
                         "shell history); put it in PARLEY_API_KEY or in a file given to --api-key-file")
    name = next((n for n in env if os.environ.get(n)), None)
    if getattr(args, "api_key_file", None):
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                key = f.readline()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--api-key-file {args.api_key_file}: cannot read it ({e}); "
                             "give a readable text file whose first line is the key") from None
        key, source = key.strip(), f"--api-key-file {args.api_key_file}"
    elif name:
        key, source = os.environ[name], name
    else:
        return None
    if not key or key != key.strip() or not key.isprintable() or not key.isascii():
        raise ValueError(f"{source}: the API key must be non-empty printable ASCII without surrounding spaces")
    return key
