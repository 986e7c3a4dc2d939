"""Ctrl+Q and Ctrl+C quit the app at once in every state: while the model still loads and while INT4 is made
in the background (work that would go on for minutes). The app runs as its own process, as users run it:
before the fix the process waited at exit for that work (asyncio joins Textual's thread workers), and
Ctrl+C only said "press ctrl+q"."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


@pytest.mark.parametrize("state", ["loading", "upgrading"])
@pytest.mark.parametrize("key", ["ctrl+q", "ctrl+c"])
def test_a_key_quits_while_work_goes_on(tmp_path, state, key):
    app = subprocess.Popen([sys.executable, str(TESTS / "quit_fake_app.py"), str(tmp_path), state, key],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = time.monotonic()
    try:
        out = app.communicate(timeout=90)[0]  # the busy work never ends: only quitting ends the process
    except subprocess.TimeoutExpired:
        app.kill()
        out = app.communicate()[0]
        raise AssertionError(f"{key} while {state}: the app did not exit\n{out[-3000:]}") from None
    print(f"{key} while {state}: exited after {time.monotonic() - started:.1f}s")
    assert "busy" in out and "exited" in out, out[-3000:]
    assert app.returncode == 0, out[-3000:]
