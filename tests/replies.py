"""Drive one Session.reply to its end, optionally cancelling once the shown text passes a mark."""

from __future__ import annotations

import threading
from collections.abc import Callable

from parley.engine.events import Done, TextDelta


def collect(engine, messages, params, cancel_when: Callable[[str, int], bool] | None = None):
    """(shown text, Done); `cancel_when(text, n_deltas)` sets the cancel event when it returns True."""
    cancel, text, done, n = threading.Event(), "", None, 0
    for ev in engine.session().reply(messages, params, cancel):
        if isinstance(ev, TextDelta):
            text, n = text + ev.text, n + 1
            if cancel_when is not None and cancel_when(text, n):
                cancel.set()
        elif isinstance(ev, Done):
            done = ev
    return text, done
