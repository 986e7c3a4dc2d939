"""`parley web`: the chat app in headless Chromium through textual-serve on 127.0.0.1 — ask a question,
see the streamed answer arrive in the browser, move a slider."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from parley.app import cli
from parley.app.server import web

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
TESTS = Path(__file__).parent


def test_web_command_runs_chat_with_the_flags_given():
    args = cli.build_parser().parse_args(["web", "--port", "9001", "--temperature", "0.2", "--quant", "none"])
    command = web.chat_command(args)
    assert command.endswith("-m parley.app.cli chat --quant none --temperature 0.2")
    assert web.HOST == "127.0.0.1"


def test_tabs_share_one_engine_server():
    """`parley web` loads the model once, in a `parley serve` on 127.0.0.1; each tab's chat talks to it."""
    args = cli.build_parser().parse_args(["web", "--model", "org/m", "--quant", "none", "--temperature", "0.2"])
    serve = web.serve_command(args, 5555)
    assert serve[1:] == ["-m", "parley.app.cli", "serve", "--host", "127.0.0.1", "--port", "5555",
                         "--model", "org/m", "--quant", "none"]
    chat = web.chat_command(args, "http://127.0.0.1:5555/v1")
    assert chat.endswith("-m parley.app.cli chat --temperature 0.2 --server http://127.0.0.1:5555/v1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, pause=lambda: time.sleep(0.2)):
    """Poll `predicate` until it is truthy; `pause` lets Playwright's sync API deliver its events."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        pause()


def answered(folder: Path) -> list[tuple[str, str]] | None:
    """The first conversation's (role, text) once it has an answer."""
    from parley.app.store import Store

    if not (folder / "parley.db").exists():
        return None
    store = Store(folder / "parley.db")
    try:
        for conv in store.conversations():
            messages = [(m.role, m.content) for m in store.messages(conv.id)]
            if any(role == "assistant" for role, _ in messages):
                return messages
    finally:
        store.close()
    return None


def saved_temperature(folder: Path) -> float | None:
    try:
        return json.loads((folder / "settings.json").read_text())["params"]["temperature"]
    except (OSError, ValueError, KeyError):
        return None


def start_web(tmp_path: Path, output: int | None, **env_extra: str):
    """playwright's sync API, and `parley web`'s server (textual-serve over the fake app) starting on a free
    port; skips when playwright, textual-serve or chromium is missing. Returns (sync_api, server, url, up)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    pytest.importorskip("textual_serve", reason="textual-serve is not installed")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no browser: {CHROMIUM} is missing (apt-get install chromium; scripts/setup.sh test does it)")
    port = free_port()
    env = {**os.environ, "PARLEY_WEB_TEST_DIR": str(tmp_path), **env_extra,
           "PYTHONPATH": os.pathsep.join([str(TESTS.parent.parent), os.environ.get("PYTHONPATH", "")])}
    command = f"{sys.executable} {TESTS / 'web_fake_app.py'}"
    code = f"from parley.app.server.web import serve; serve({command!r}, {port})"
    server = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=output,
                              stderr=subprocess.STDOUT if output == subprocess.PIPE else subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"

    def up() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    return sync_api, server, url, up


def test_ask_see_the_streamed_answer_and_move_a_slider_in_chromium(tmp_path):
    from web_fake_app import ANSWER

    sync_api, server, url, up = start_web(tmp_path, subprocess.PIPE)

    received: list[str] = []
    try:
        wait_for(up, 60, f"textual-serve on {url}")
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, timeout=180_000)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(180_000)  # a bound for a busy 2-core machine (Playwright's default: 30 s)

            def on_socket(ws) -> None:
                ws.on("framereceived", lambda payload: received.append(
                    payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload))

            page.on("websocket", on_socket)
            pump = lambda: page.wait_for_timeout(200)
            page.goto(url)
            page.wait_for_selector(".xterm", timeout=60_000)
            # The app is up when its placeholder has been drawn in the terminal.
            wait_for(lambda: "Message Parley" in "".join(received), 60, "the chat screen in the browser", pump)
            page.locator(".xterm").click()
            page.keyboard.type("What is the capital of France?")  # at once after the click: in order
            page.keyboard.press("Enter")
            stored = wait_for(lambda: answered(tmp_path), 60, "the answer to be saved", pump)
            assert stored == [("user", "What is the capital of France?"), ("assistant", ANSWER)]
            # The browser received the answer as it streamed (words of it reach the terminal).
            wait_for(lambda: "Seine" in "".join(received), 30, "the answer on the browser's terminal", pump)
            page.keyboard.press("F2")  # the sliders open with temperature focused
            page.keyboard.press("ArrowRight")
            page.keyboard.press("ArrowRight")
            # each step is saved as it happens: wait for the second (a first, 0.75, may be read in between)
            kept = wait_for(lambda: saved_temperature(tmp_path) == 0.8 and 0.8, 30, "the slider's 0.8 to be kept", pump)
            assert kept == 0.8
            browser.close()
    finally:
        server.terminate()
        try:
            out = server.communicate(timeout=20)[0]
        except subprocess.TimeoutExpired:
            server.kill()
            out = server.communicate()[0]
        if sys.exc_info()[0] is not None:
            print(out.decode("utf-8", "replace")[-4000:])
