"""The running figures of one reply, and the `Stats` event they make."""

from __future__ import annotations

import time

from .events import Stats

STATS_EVERY_S = 0.5  # how often a reply in flight reports its figures


class ReplyStats:
    """Counts what a reply showed, drafted and passed through the target, and when."""

    def __init__(self, context_window: int) -> None:
        self.t0 = time.perf_counter()
        self.t_first: float | None = None  # when the first token was shown
        self.t_reported = self.t0
        self.context_window = context_window
        self.prompt_tokens = self.reused_tokens = self.context_tokens = 0
        self.new_tokens = self.accepted = self.proposed = self.passes = 0
        self.drafter = ""
        self.speculation_note = ""
        self.batch = 1  # sequences that shared the latest pass

    def round(self, proposed: int, shown: int, accepted: int) -> None:
        """One target pass: `proposed` drafted, `shown` tokens shown, the first `accepted` of them drafts."""
        self.passes += 1
        self.proposed += proposed
        self.new_tokens += shown
        self.accepted += accepted
        if shown and self.t_first is None:
            self.t_first = time.perf_counter()

    def due(self) -> bool:
        """True every STATS_EVERY_S: time for live figures in the status bar."""
        now = time.perf_counter()
        if now - self.t_reported < STATS_EVERY_S:
            return False
        self.t_reported = now
        return True

    def stats(self) -> Stats:
        now = time.perf_counter()
        decode_s = now - self.t_first if self.t_first is not None else 0.0
        n = self.new_tokens
        return Stats(
            new_tokens=n,
            tokens_per_s=(n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0,
            accepted=self.accepted,
            proposed=self.proposed,
            tokens_per_target_pass=n / self.passes if self.passes else 0.0,
            ttft_s=(self.t_first or now) - self.t0,
            prompt_tokens=self.prompt_tokens,
            reused_tokens=self.reused_tokens,
            context_tokens=self.context_tokens,
            context_window=self.context_window,
            drafter=self.drafter,
            speculation_note=self.speculation_note,
            batch=self.batch,
        )
