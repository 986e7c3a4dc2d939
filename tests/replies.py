"""Drive one Session.reply to its end, optionally cancelling once the shown text passes a mark."""

from __future__ import annotations

import threading
from collections.abc import Callable

from parley.engine.events import TextDelta, consume


def collect(engine, messages, params, cancel_when: Callable[[str, int], bool] | None = None):
    """(shown text, Done); `cancel_when(text, n_deltas)` sets the cancel event when it returns True."""
    cancel = threading.Event()

    def watch(ev, so_far) -> None:
        if isinstance(ev, TextDelta) and cancel_when is not None and cancel_when(so_far.text, so_far.deltas):
            cancel.set()

    reply = consume(engine.session().reply(messages, params, cancel), watch)
    return reply.text, reply.done
