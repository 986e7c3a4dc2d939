"""A reply in flight: the engine thread pushes events, the UI timer drains them in batches.

Neither side waits on the other: the lock is held only to append or swap a few references.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from parley.app.widgets.message import ChatMessage
from parley.engine.events import Done, Stats, TextDelta


class ReplyBuffer:
    """Events of one reply, pushed by the engine thread and drained by the UI timer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._text: list[str] = []
        self._stats: Stats | None = None
        self._done: Done | None = None
        self.tokens = 0  # tokens decided so far: TextDelta count, corrected by Stats.new_tokens
        self.started = time.perf_counter()
        self.first_at: float | None = None
        self.last_at: float | None = None

    def push(self, event: TextDelta | Stats | Done) -> None:
        with self._lock:
            if isinstance(event, TextDelta):
                self._text.append(event.text)
                self.tokens += 1
                self.last_at = time.perf_counter()
                if self.first_at is None:
                    self.first_at = self.last_at
            elif isinstance(event, Stats):
                self._stats = event
                self.tokens = max(self.tokens, event.new_tokens)
            elif self._done is None:
                self._done = event

    def live_figures(self) -> tuple[int, float, float | None]:
        """(deltas so far, their rate after the first, time to the first): the UI's estimate until the
        engine's own `Stats` arrive (it may send them only at the end)."""
        with self._lock:
            first, last, n = self.first_at, self.last_at, self.tokens
        if first is None or last is None:
            return 0, 0.0, None
        rate = (n - 1) / (last - first) if n > 1 and last > first else 0.0
        return n, rate, first - self.started

    def drain(self) -> tuple[str, Stats | None, Done | None]:
        """Everything since the last drain; `Done` is returned only after all text before it."""
        with self._lock:
            text, stats, done = "".join(self._text), self._stats, self._done
            self._text.clear()
            self._stats = None
            return text, stats, done


@dataclass
class ActiveReply:
    view: ChatMessage
    buffer: ReplyBuffer = field(default_factory=ReplyBuffer)
    cancel: threading.Event = field(default_factory=threading.Event)
    finished: bool = False
    has_stats: bool = False
