"""A reply in flight: the engine thread pushes events, the UI timer drains them in batches.

Neither side waits on the other: the lock is held only to append or swap a few references.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from parley.app.widgets.message import ChatMessage
from parley.engine.events import Done, Event, Notice, Prefill, Stats, TextDelta

SHOW_PREFILL_AFTER_S = 1.0  # a prompt read faster than this needs no progress figure


@dataclass
class Batch:
    """What arrived since the last drain."""

    text: str = ""
    drafted: list[tuple[int, int]] = field(default_factory=list)  # (start, end) in `text` from accepted drafts
    stats: Stats | None = None
    notices: list[str] = field(default_factory=list)
    done: Done | None = None  # set only once all text before it is in `text`


class ReplyBuffer:
    """Events of one reply, pushed by the engine thread and drained by the UI timer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batch = Batch()
        self._pieces: list[str] = []
        self._length = 0  # characters in `_pieces`
        self._done: Done | None = None
        self.tokens = 0  # tokens decided so far: TextDelta count, corrected by Stats.new_tokens
        self.started = time.perf_counter()
        self.first_at: float | None = None
        self.last_at: float | None = None
        self._prefill: list[tuple[float, Prefill]] = []  # (when, event): the first and the latest

    def push(self, event: Event) -> None:
        with self._lock:
            batch = self._batch
            if isinstance(event, TextDelta):
                if event.draft_chars:
                    batch.drafted.append((self._length, self._length + min(event.draft_chars, len(event.text))))
                self._pieces.append(event.text)
                self._length += len(event.text)
                self.tokens += 1
                self.last_at = time.perf_counter()
                if self.first_at is None:
                    self.first_at = self.last_at
            elif isinstance(event, Stats):
                batch.stats = event
                self.tokens = max(self.tokens, event.new_tokens)
            elif isinstance(event, Notice):
                batch.notices.append(event.text)
            elif isinstance(event, Prefill):
                self._prefill[1:] = [(time.perf_counter(), event)]
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

    def prefill_figures(self) -> tuple[int, int, float | None] | None:
        """(tokens read, tokens to read, seconds left or None) while a long prompt is read and has taken over
        a second; None otherwise. The estimate is the rate since the first chunk, so it follows a busy machine."""
        with self._lock:
            if not self._prefill or self.first_at is not None:
                return None
            (t0, first), (t1, last) = self._prefill[0], self._prefill[-1]
        if time.perf_counter() - self.started < SHOW_PREFILL_AFTER_S:
            return None
        rate = (last.done - first.done) / (t1 - t0) if t1 > t0 and last.done > first.done else 0.0
        return last.done, last.total, (last.total - last.done) / rate if rate else None

    def drain(self) -> Batch:
        """Everything since the last drain; `done` comes only with (or after) all text before it."""
        with self._lock:
            batch, self._batch = self._batch, Batch()
            batch.text = "".join(self._pieces)
            self._pieces.clear()
            self._length = 0
            batch.done = self._done
            return batch


@dataclass
class ActiveReply:
    view: ChatMessage
    conversation_id: int  # where the reply is saved
    buffer: ReplyBuffer = field(default_factory=ReplyBuffer)
    cancel: threading.Event = field(default_factory=threading.Event)
    finished: bool = False
    has_stats: bool = False
    notes: set[str] = field(default_factory=set)  # speculation notes already shown for this reply
