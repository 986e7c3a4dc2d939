"""`parley serve` on a free 127.0.0.1 port over the real embedded model, shared by the serve/remote tests.

The model loads once per test process (`real_engine`); each `running_server` is a fresh server over it, stopped
when the `with` ends. Every log line the server writes is kept, so a test can read what it would have printed.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache

from parley.app.server.api import ParleyServer, make_server


@cache
def real_engine():
    from parley.engine.engine import Engine

    return Engine.load(None, quant="none")


@contextmanager
def running_server(engine=None, **kwargs) -> Iterator[tuple[ParleyServer, str]]:
    """(server, base URL ending in /v1); `server.logged` holds its log lines."""
    logged: list[str] = []
    server = make_server(engine or real_engine(), "127.0.0.1", 0, log=logged.append, **kwargs)
    server.logged = logged  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        poll(lambda: not server.queue.busy, what="the engine to finish its reply")  # one engine, shared
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


def thread_stacks() -> str:
    """Every thread's stack, innermost frames last: what a test that timed out was waiting on."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(f"--- {names.get(ident, ident)}\n" + "".join(traceback.format_stack(frame)[-6:])
                     for ident, frame in sys._current_frames().items())


def poll(predicate: Callable[[], object], timeout: float = 120.0, what: str = "") -> None:
    """Wait for a condition (generous timeout for a busy 2-core machine); never a fixed sleep."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}; where every thread "
                                 f"was:\n{thread_stacks()}")
        time.sleep(0.01)
