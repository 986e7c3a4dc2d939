"""`parley web` leaves nothing behind: a tab closed abruptly, the browser killed (SIGKILL) and `parley web`
itself killed each end the chat processes they started, even while those still run background work (an
INT4 quantization that would go on for minutes).

Before the fix the tab's process outlived its tab: Textual's web driver ignored the end of its input, and
quitting waited for the background thread (a Textual thread worker, joined by asyncio at exit).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from test_web_serves_the_app_in_a_browser import CHROMIUM, FLAGS, start_web, wait_for


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# Playwright's own bound on connecting and loading a page (its default: 30 s). A bound, not a race: on a busy
# 2-core machine (the suite's four workers) Chromium once took longer than 30 s to answer over CDP.
BROWSER_MS = 180_000


def tab_pids(folder: Path) -> set[int]:
    """The chat processes started so far (each writes its pid when it starts)."""
    pids = folder / "pids"
    return {int(p.name) for p in pids.iterdir()} if pids.exists() else set()


def start_browser(profile: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Chromium in its own process group (so the test can kill all of it), and its DevTools address. Its stderr
    goes to a file, never a pipe: a pipe nobody reads once the address is found fills with Chromium's warnings
    (many on a fresh machine) and then blocks the browser mid-write, so it stops answering over CDP."""
    log = profile.with_suffix(".stderr")
    with open(log, "wb") as err:
        browser = subprocess.Popen([CHROMIUM, *FLAGS, "--remote-debugging-port=0", f"--user-data-dir={profile}"],
                                   stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)

    def address() -> str | None:
        if found := re.search(rb"DevTools listening on (ws://\S+)", log.read_bytes()):
            return found.group(1).decode()
        if browser.poll() is not None:
            raise AssertionError(f"chromium exited ({browser.returncode}) without a DevTools address: "
                                 f"{log.read_bytes()[-2000:].decode(errors='replace')}")
        return None

    return browser, wait_for(address, 120, "Chromium's DevTools address")


def connect(p, profile: Path, browsers: list[subprocess.Popen[bytes]]):
    """A fresh Chromium and Playwright's context over CDP. On a loaded machine a Chromium once accepted the CDP
    socket and never finished the handshake; such a browser (not `parley web`, which this test is about) is killed
    and one more started, once."""
    from playwright.sync_api import TimeoutError as HandshakeTimeout

    for attempt in (1, 2):
        browser, address = start_browser(profile.with_name(f"{profile.name}-{attempt}"))
        browsers.append(browser)
        try:
            context = p.chromium.connect_over_cdp(address, timeout=BROWSER_MS / 2).contexts[0]
        except HandshakeTimeout:
            if attempt == 2:
                raise
            print(f"Chromium at {address} did not finish the CDP handshake: starting another")
            kill_browser(browser)
            continue
        context.set_default_timeout(BROWSER_MS)
        return browser, context
    raise AssertionError("unreachable")


def kill_browser(browser: subprocess.Popen[bytes]) -> None:
    os.killpg(browser.pid, signal.SIGKILL)
    browser.wait()


def test_closing_a_tab_killing_the_browser_or_parley_web_leaves_no_process(tmp_path):
    sync_api, server, url, up = start_web(tmp_path, subprocess.DEVNULL, PARLEY_WEB_TEST_BUSY="1")
    browsers: list[subprocess.Popen[bytes]] = []

    def gone(pids: set[int], what: str) -> None:
        started = time.monotonic()
        wait_for(lambda: not any(alive(p) for p in pids), 60, f"{what}: processes {sorted(pids)} to end")
        print(f"{what}: ended after {time.monotonic() - started:.1f}s")  # the budget is 2 s

    try:
        wait_for(up, 60, f"textual-serve on {url}")
        with sync_api.sync_playwright() as p:
            browser, context = connect(p, tmp_path / "profile-1", browsers)
            first, second = context.new_page(), context.new_page()
            first.goto(url)
            wait_for(lambda: len(tab_pids(tmp_path)) == 1, 60, "the first tab's process",
                     lambda: first.wait_for_timeout(200))
            (first_pid,) = tab_pids(tmp_path)
            second.goto(url)
            wait_for(lambda: len(tab_pids(tmp_path)) == 2, 60, "the second tab's process",
                     lambda: second.wait_for_timeout(200))
            (second_pid,) = tab_pids(tmp_path) - {first_pid}

            first.close()  # the tab goes: no unload handlers, the socket just closes
            gone({first_pid}, "a closed tab")
            assert alive(second_pid), "closing one tab ended another"

            kill_browser(browser)  # the browser dies: no goodbye on the socket at all
            gone({second_pid}, "a killed browser")

            browser, context = connect(p, tmp_path / "profile-2", browsers)
            third = context.new_page()
            third.goto(url)
            wait_for(lambda: len(tab_pids(tmp_path)) == 3, 60, "the third tab's process",
                     lambda: third.wait_for_timeout(200))
            server.kill()  # `parley web` dies (SIGKILL: it cannot tell its tabs)
            server.wait()
            gone(tab_pids(tmp_path), "a killed parley web")
    finally:
        for browser in browsers:
            if browser.poll() is None:
                kill_browser(browser)
        if server.poll() is None:
            server.kill()
            server.wait()
        for pid in tab_pids(tmp_path):  # never leave one behind, even when the test failed
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
