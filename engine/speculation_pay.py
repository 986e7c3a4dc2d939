"""Whether speculation pays: the measured cost of a target pass by its length, the draft length that
maximises expected tokens per second, and the `auto` mode's decision to stop drafting in a reply.

Why measured, not assumed: what a k-token verification pass costs against a 1-token pass depends on
the device, the kernels and the context depth (on the 2-core CPU a 17-token pass at 2,000 tokens of
context cost 6.9x a 1-token pass). Every choice here uses only rounds already run, so it changes how
many tokens a pass verifies, never which tokens are emitted.
"""

from __future__ import annotations

from collections.abc import Sequence

PRIOR_SLOPE = 0.15  # the cost of one more verified token, in 1-token passes, before any is measured
EMA = 0.25  # weight of a new measurement


class PassCost:
    """cost(T) ~ base + slope * (T - 1): seconds of one round whose target pass reads T tokens
    (drafting and verification included), from moving averages of the rounds the engine ran."""

    def __init__(self) -> None:
        self.base: float | None = None  # seconds of a 1-token round
        self.slope: float | None = None  # seconds per extra token
        self._pending: list[tuple[int, float]] = []  # longer rounds seen before any 1-token round

    def add(self, tokens: int, seconds: float) -> None:
        if tokens <= 1:
            self.base = seconds if self.base is None else (1 - EMA) * self.base + EMA * seconds
            pending, self._pending = self._pending, []
            for t, s in pending:
                self.add(t, s)
            return
        if self.base is None:
            self._pending = [*self._pending[-15:], (tokens, seconds)]
            return
        slope = max(0.0, (seconds - self.base) / (tokens - 1))
        self.slope = slope if self.slope is None else (1 - EMA) * self.slope + EMA * slope

    def ratio(self, tokens: int) -> float:
        """cost(tokens) / cost(1)."""
        if self.base is None or self.base <= 0:
            return 1 + PRIOR_SLOPE * (tokens - 1)
        slope = self.slope if self.slope is not None else PRIOR_SLOPE * self.base
        return 1 + slope * (tokens - 1) / self.base


def best_length(scores: Sequence[float], cost: PassCost, calibration: float = 1.0) -> int:
    """How many of a proposal's guesses to verify: the n maximising (1 + expected accepted) / cost(1 + n),
    where the chance that the first i guesses all land is scores[i-1] * calibration (the drafter's own
    running probability, scaled by how often this reply's guesses have landed against that estimate)."""
    best_n, best_rate, expected = 0, 1.0, 1.0
    for n, score in enumerate(scores, start=1):
        expected += min(1.0, score * calibration)
        rate = expected / cost.ratio(1 + n)
        if rate > best_rate:
            best_n, best_rate = n, rate
    return best_n


class PayCheck:
    """The `auto` mode's judgement over one reply: after `min_rounds` drafted rounds, speculation stays
    on only while its tokens per second are at least plain decoding's (one token per 1-token round).
    The first drafted round is not counted: it carries the drafter's one-off catching up with the
    prompt (indexing a pasted document, a draft model's prefill)."""

    def __init__(self, cost: PassCost, min_rounds: int = 6) -> None:
        self.cost, self.min_rounds = cost, min_rounds
        self.rounds = self.tokens = 0  # drafted rounds and the tokens they decided
        self.seconds = 0.0
        self.note = ""  # why speculation was turned off, in plain words ("" while it is on)
        self._warm = False

    def add(self, drafted: int, tokens: int, seconds: float) -> None:
        """One round: `drafted` guesses verified, `tokens` decided, in `seconds` (drafting included)."""
        if drafted and not self._warm:
            self._warm = True
        elif drafted:
            self.rounds, self.tokens, self.seconds = self.rounds + 1, self.tokens + tokens, self.seconds + seconds

    @property
    def needs_plain_round(self) -> bool:
        """True when a verdict is due but no 1-token round has been timed yet to compare with."""
        return self.rounds >= self.min_rounds and self.cost.base is None

    def pays(self) -> bool:
        """False once measured drafting is slower than plain decoding (then for the rest of the reply)."""
        if self.note:
            return False
        if self.rounds < self.min_rounds or self.cost.base is None:
            return True
        speedup = self.tokens * self.cost.base / self.seconds
        if speedup >= 1.0:
            return True
        self.note = (f"speculation turned off for this reply: guesses were too rarely right to pay "
                     f"({self.tokens / self.rounds:.1f} tokens per pass, {speedup:.2f}x plain decoding's speed)")
        return False
