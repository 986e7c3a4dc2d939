"""`parley web`: the same chat app in a browser, served by textual-serve on 127.0.0.1 only.

One `parley serve` holds the engine; each browser tab runs its own `parley chat --server` process over it,
so a new tab opens at once instead of loading the model again. Nothing listens beyond this machine, and
nothing outlives its tab: a tab's process leaves when its tab, the browser or `parley web` goes
(`TabDriver` in tab_driver.py), and the engine's process when `parley web` does.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from parley.app import tui

HOST = "127.0.0.1"
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (default: 8000)")
    tui.add_arguments(parser)


# The engine's flags: the shared `parley serve` takes them, the tabs do not.
MODEL_FLAGS = ("model", "quant", "draft", "device", "compile", "kv_cache", "threads", "parallel")


def flags(args: argparse.Namespace, add: Callable[[argparse.ArgumentParser], None],
          skip: tuple[str, ...] = ()) -> list[str]:
    """The command-line flags, among those `add` defines, that `args` sets away from their defaults."""
    parser = argparse.ArgumentParser()
    add(parser)
    argv: list[str] = []
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", *skip):
            continue
        value = getattr(args, action.dest, None)
        if value is None or value == action.default:
            continue
        if action.nargs == 0:  # a switch such as --compile
            argv.append(action.option_strings[-1])
        else:
            argv += [action.option_strings[-1], str(value)]
    return argv


def chat_command(args: argparse.Namespace, server: str | None = None) -> str:
    """The `parley chat` command line each browser tab runs: over `server` (the shared engine) when given,
    with the chat flags given here."""
    argv = [sys.executable, "-m", "parley.app.cli", "chat"]
    if server is None:
        return shlex.join(argv + flags(args, tui.add_arguments))
    skip = (*MODEL_FLAGS, "server", "api_key", "api_key_file")  # the key goes by the environment (run)
    return shlex.join(argv + flags(args, tui.add_arguments, skip=skip) + ["--server", server])


def serve_command(args: argparse.Namespace, port: int) -> list[str]:
    """The one `parley serve` that holds the engine every tab talks to."""
    from parley.app import cli

    return [sys.executable, "-m", "parley.app.cli", "serve", "--host", HOST, "--port", str(port),
            *flags(args, cli.add_model_arguments)]


def die_with_parent() -> None:
    """In a child, before exec: be sent SIGTERM when `parley web` ends, however it ends (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: stopping `parley web` still stops it (run's finally)
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_engine(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    """Start the shared `parley serve` (its loading progress shows on this terminal) and wait until it answers;
    ValueError when it fails to start."""
    port = free_port()
    child = subprocess.Popen(serve_command(args, port), stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
    url = f"http://{HOST}:{port}/v1"
    while child.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2):
                return child, url
        except OSError:
            time.sleep(0.2)
    raise ValueError(f"the model server for the tabs did not start (parley serve exited with {child.returncode}); "
                     "see its message above")


def stop(child: subprocess.Popen[bytes]) -> None:
    """End the engine's server at once: it keeps nothing that a kill could lose (cache writes are atomic)."""
    child.kill()
    child.wait()


def guard(port: int):
    """aiohttp middleware: only requests addressed to this machine (Host 127.0.0.1 or localhost), and from no web
    page but the app's own (Origin). A page elsewhere could otherwise reach the app through DNS rebinding, or
    open its websocket (which no CORS rule covers) and drive a chat from the visitor's browser."""
    from aiohttp import web

    from parley.app.server.api import host_names, split_host

    host_ok = host_names(HOST)
    origins = {f"http://{name}:{port}" for name in ("127.0.0.1", "localhost")}

    @web.middleware
    async def check(request, handler):
        hosts = request.headers.getall("Host", [])
        name = split_host(hosts[0]) if len(hosts) == 1 else None
        if name is None or not host_ok(name):
            return web.Response(status=403, text="parley web answers requests to 127.0.0.1 or localhost only\n")
        origin = request.headers.getall("Origin", [])
        if origin and (len(origin) > 1 or origin[0] not in origins):
            return web.Response(status=403, text="parley web answers its own page only\n")
        return await handler(request)
    return check


# Keys reach the app without a click first: the terminal's input takes the focus as soon as it exists
# (textual-serve's page leaves it unfocused, so the first keys typed went nowhere).
FOCUS_SCRIPT = """<script>
  (function focusTerminal() {
    const input = document.querySelector(".xterm-helper-textarea");
    if (input) { input.focus(); } else { setTimeout(focusTerminal, 50); }
  })();
</script>
"""


def page_templates(folder: Path) -> Path | None:
    """textual-serve's page template with `FOCUS_SCRIPT` added, written to `folder`; None (its own page)
    when that template is not where this version of textual-serve keeps it."""
    import textual_serve

    page = Path(textual_serve.__file__).parent / "templates" / "app_index.html"
    try:
        html = page.read_text(encoding="utf-8")
    except OSError:
        return None
    if "</body>" not in html:
        return None
    (folder / page.name).write_text(html.replace("</body>", FOCUS_SCRIPT + "</body>", 1), encoding="utf-8")
    return folder


def serve(command: str, port: int, title: str = "Parley") -> None:
    """Serve `command` (a Textual app) on 127.0.0.1:`port` until Ctrl+C."""
    import tempfile

    from textual_serve.server import Server

    class GuardedServer(Server):
        async def _make_app(self):
            app = await super()._make_app()
            app.middlewares.append(guard(port))
            return app

    with tempfile.TemporaryDirectory(prefix="parley-web-") as folder:
        templates = page_templates(Path(folder))
        extra = {"templates_path": templates} if templates is not None else {}
        GuardedServer(command, host=HOST, port=port, title=title, **extra).serve()


def run(args: argparse.Namespace) -> int:
    try:
        import textual_serve  # noqa: F401
    except ImportError:
        print("parley: error: `parley web` needs textual-serve: pip install textual-serve", file=sys.stderr)
        return 2
    engine = None
    server = args.server
    if server is not None:
        from parley.app.server.keys import api_key

        # Every tab's process inherits the environment: the key never goes on a command line (`ps` shows
        # those) nor into textual-serve's banner, which prints the tab command.
        key = api_key(args, env=("PARLEY_API_KEY", "OPENAI_API_KEY"))
        if key:
            os.environ["PARLEY_API_KEY"] = key
    if server is None:  # one engine for every tab, instead of a model load per tab
        print("parley: loading the model for the browser tabs…", file=sys.stderr)
        engine, server = start_engine(args)
    try:
        print(f"parley: serving the chat app on http://{HOST}:{args.port} (Ctrl+C stops)", file=sys.stderr)
        serve(chat_command(args, server), args.port)
    finally:
        if engine is not None:
            stop(engine)
    atexit.register(tui.exit_now, 0)  # stopped: no interpreter teardown to wait for
    return 0
