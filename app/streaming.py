"""A reply in flight: the engine thread pushes events, the UI timer drains them in batches.

Neither side waits on the other: the lock is held only to append or swap a few references.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from parley.app.widgets.message import ChatMessage
from parley.engine.events import Done, Event, Notice, Stats, TextDelta


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
    buffer: ReplyBuffer = field(default_factory=ReplyBuffer)
    cancel: threading.Event = field(default_factory=threading.Event)
    finished: bool = False
    has_stats: bool = False
    notes: set[str] = field(default_factory=set)  # speculation notes already shown for this reply
