"""Whether speculation pays: the measured cost of a target pass by its length, the draft length that
maximises expected tokens per second, and the `auto` mode's decisions to pause and resume drafting in a reply.

Why measured, not assumed: what a k-token verification pass costs against a 1-token pass depends on
the device, the kernels and the context depth (on the 2-core CPU a 17-token pass at 2,000 tokens of
context cost 6.9x a 1-token pass). Every choice here uses only rounds already run, so it changes how
many tokens a pass verifies, never which tokens are emitted.
"""

from __future__ import annotations

from collections import deque
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
    """The `auto` mode's judgement over one reply, revised as the reply goes on.

    On: after `min_rounds` drafted rounds, drafting goes on while its tokens per second over the last
    `window` drafted rounds are at least plain decoding's (one token per timed 1-token round). The first
    drafted round is never counted: it carries the drafter's one-off catching up with the prompt
    (indexing a pasted document, a draft model's prefill).

    Off (paused): plain rounds. A cheap drafter (suffix match, prompt lookup: no model pass) goes on
    guessing without anything being verified, and each such shadow guess is scored against the tokens
    plain decoding then emits: what a drafted round would have decided (the matched guesses and one
    more) and what it would have cost (the drafting timed, the pass from the measured costs). Drafting
    resumes once the last `shadows` shadows (2 at least) say it would run `resume` times plain decoding's speed: a
    reply that starts to quote the pasted document after a stretch of free text. A dear drafter (a draft
    model) is instead tried again after `backoff` plain rounds, twice as many each time it is paused.
    Why shadows: a drafter judged on a reply's first rounds used to stay off for the rest of the reply,
    and re-trying it blindly costs dear passes each time; a shadow costs a trie lookup.
    """

    def __init__(self, cost: PassCost, min_rounds: int = 6, window: int = 12, shadows: int = 4,
                 resume: float = 1.1, backoff: int = 16) -> None:
        self.cost, self.min_rounds, self.window, self.resume = cost, min_rounds, window, resume
        self.backoff = backoff
        self.rounds = 0  # drafted rounds since drafting (re)started
        self.note = ""  # why speculation is paused, in plain words ("" while it is on)
        self.pauses = 0  # how often this reply paused drafting
        self._warm = False
        self._recent: deque[tuple[int, float]] = deque(maxlen=window)  # drafted rounds: (tokens, seconds)
        self._shadows: deque[tuple[int, float]] = deque(maxlen=shadows)  # shadow rounds, as if drafted
        self._shadow: tuple[list[int], int, float] | None = None  # guesses, how many matched, drafting seconds
        self._plain_rounds = 0  # plain rounds since the pause

    def add(self, drafted: int, tokens: int, seconds: float) -> None:
        """One round: `drafted` guesses verified, `tokens` decided, in `seconds` (drafting included)."""
        if not drafted:
            self._plain_rounds += bool(self.note)
        elif not self._warm:
            self._warm = True
        else:
            self.rounds += 1
            self._recent.append((tokens, seconds))

    @property
    def needs_plain_round(self) -> bool:
        """True when a verdict is due but no 1-token round has been timed yet to compare with."""
        return self.rounds >= self.min_rounds and self.cost.base is None

    @property
    def shadowing(self) -> bool:
        """True when a shadow guess is wanted this round (paused, and no earlier shadow still open)."""
        return bool(self.note) and self._shadow is None and self.cost.base is not None

    def pays(self) -> bool:
        """Whether to draft this round."""
        if self.note:
            if len(self._shadows) >= 2 and self._speedup(self._shadows) >= self.resume:
                self._restart()
            elif not self._shadows and self._plain_rounds >= self.backoff * 2 ** (self.pauses - 1):
                self._restart()  # nothing to judge by but trying again (a draft model)
            return not self.note
        if self.rounds < self.min_rounds or self.cost.base is None:
            return True
        speedup = self._speedup(self._recent)
        if speedup >= 1.0:
            return True
        self.pauses += 1
        per_pass = sum(t for t, _ in self._recent) / len(self._recent)
        self.note = (f"speculation paused: guesses were too rarely right to pay ({per_pass:.1f} "
                     f"tokens per pass, {speedup:.2f}x plain decoding's speed); it is tried again as the reply goes on")
        self._plain_rounds = 0
        return False

    def shadow(self, guesses: list[int], seconds: float) -> None:
        """Guesses a paused drafter made this round (nothing verified), and the seconds drafting them took."""
        if guesses and self.shadowing:
            self._shadow = (list(guesses), 0, seconds)

    def saw(self, new: list[int]) -> None:
        """The tokens a round decided: scores the open shadow guess against them."""
        if self._shadow is None:
            return
        guesses, matched, seconds = self._shadow
        for token in new:
            if token != guesses[matched]:
                break
            matched += 1
            if matched == len(guesses):
                break
        else:  # every token of this round matched, and guesses are left: the shadow stays open
            self._shadow = (guesses, matched, seconds)
            return
        self._shadow = None  # a drafted round would have decided the matched guesses and one token more
        assert self.cost.base is not None
        self._shadows.append((matched + 1, seconds + self.cost.base * self.cost.ratio(1 + len(guesses))))

    def _speedup(self, rounds: deque[tuple[int, float]]) -> float:
        """Tokens per second of these rounds against plain decoding's."""
        assert self.cost.base is not None
        return sum(t for t, _ in rounds) * self.cost.base / max(1e-12, sum(s for _, s in rounds))

    def _restart(self) -> None:
        self.note, self.rounds = "", 0
        self._recent.clear()
        self._shadows.clear()
        self._shadow = None
