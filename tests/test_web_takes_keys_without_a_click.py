"""`parley web`: the page takes keys at once, no click on the terminal first (before, the first keys typed
went nowhere until the user clicked)."""

from __future__ import annotations

import subprocess
import sys

from test_web_serves_the_app_in_a_browser import CHROMIUM, FLAGS, answered, start_web, wait_for


def test_type_and_send_without_clicking(tmp_path):
    sync_api, server, url, up = start_web(tmp_path, subprocess.PIPE)
    received: list[str] = []
    try:
        wait_for(up, 60, f"textual-serve on {url}")
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, timeout=180_000)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(180_000)
            page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: received.append(
                payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload)))
            pump = lambda: page.wait_for_timeout(200)
            page.goto(url)
            page.wait_for_selector(".xterm", timeout=60_000)
            wait_for(lambda: "Message Parley" in "".join(received), 60, "the chat screen in the browser", pump)
            page.keyboard.type("What is the capital of France?")  # no click
            page.keyboard.press("Enter")
            stored = wait_for(lambda: answered(tmp_path), 60, "the answer to be saved", pump)
            assert stored[0] == ("user", "What is the capital of France?")
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
