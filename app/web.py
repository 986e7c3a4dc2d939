"""`parley web`: the same chat app in a browser, served by textual-serve on 127.0.0.1 only.

Each browser tab runs its own `parley chat` process with the flags given here; nothing listens beyond
this machine.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from parley.app import tui

HOST = "127.0.0.1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (default: 8000)")
    tui.add_arguments(parser)


def chat_command(args: argparse.Namespace) -> str:
    """The `parley chat` command line each browser session runs, with the chat flags given here."""
    chat = argparse.ArgumentParser()
    tui.add_arguments(chat)
    argv = [sys.executable, "-m", "parley.app.cli", "chat"]
    for action in chat._actions:
        if not action.option_strings or action.dest == "help":
            continue
        value = getattr(args, action.dest, None)
        if value is None or value == action.default:
            continue
        if action.nargs == 0:  # a switch such as --compile
            argv.append(action.option_strings[-1])
        else:
            argv += [action.option_strings[-1], str(value)]
    return shlex.join(argv)


def serve(command: str, port: int, title: str = "Parley") -> None:
    """Serve `command` (a Textual app) on 127.0.0.1:`port` until Ctrl+C."""
    from textual_serve.server import Server

    Server(command, host=HOST, port=port, title=title).serve()


def run(args: argparse.Namespace) -> int:
    try:
        import textual_serve  # noqa: F401
    except ImportError:
        print("parley: error: `parley web` needs textual-serve: pip install textual-serve", file=sys.stderr)
        return 2
    print(f"parley: serving the chat app on http://{HOST}:{args.port} (Ctrl+C stops)", file=sys.stderr)
    serve(chat_command(args), args.port)
    return 0
