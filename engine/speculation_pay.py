"""How much a reply drafts each round: the measured cost of a target pass by its length, the draft length that
maximises expected tokens per second, the `auto` mode's decisions to pause and resume a draft model, and the
policy that holds them for one reply (`SpeculationPolicy`).

Why measured, not assumed: what a k-token verification pass costs against a 1-token pass depends on
the device, the kernels and the context depth (on the 2-core CPU a 17-token pass at 2,000 tokens of
context cost 6.9x a 1-token pass). Why medians: a neighbouring process, a page fault or the drafter's
first round (indexing a pasted document) makes single rounds many times dearer; a moving average
follows such a stall, a median of recent passes does not (a verdict from a few rounds' wall time once paused
a drafter worth 1.45x). Every choice here uses only rounds already run, so it changes how
many tokens a pass verifies, never which tokens are emitted.
"""

from __future__ import annotations

import os
from collections import deque
from itertools import combinations
from statistics import median
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .params import GenerationParams
    from .speculative import Drafter, Proposal

PRIOR_SLOPE = 0.15  # the cost of one more verified token, in 1-token passes, before any is measured
SAMPLES = 31  # passes (and drafting times) each median is taken over: the most recent ones


class PassCost:
    """cost(T) ~ base + slope * (T - 1): seconds of a target pass that reads T tokens (rows: one reply's, or
    several replies' in a shared pass), fitted robustly: base is the median of recent 1-token passes, slope the
    median of (seconds - base) / (T - 1) over recent longer passes (a Theil-Sen-like fit anchored at T = 1), so
    a stalled pass moves neither. Until a 1-token pass runs (a server whose passes always hold several replies),
    `ratio` comes from a Theil-Sen fit over the longer passes (the median slope over pairs of passes of different
    lengths, then the median intercept) once two lengths were timed."""

    def __init__(self) -> None:
        self._ones: deque[float] = deque(maxlen=SAMPLES)  # seconds of recent 1-token passes
        self._longer: deque[tuple[int, float]] = deque(maxlen=2 * SAMPLES)  # (tokens, seconds) of longer ones
        self._fitted: tuple[float, float] | None = None  # the fit without 1-token passes, kept until the next add
        # cost of one more row in 1-token passes, kept until the next add: the scheduler asks `ratio` twice per
        # candidate guess each round, and each answer is medians over the samples (~5 us; 0.08 ms a round)
        self._per_row: float | None = None

    def add(self, tokens: int, seconds: float) -> None:
        if tokens <= 1:
            self._ones.append(seconds)
        else:
            self._longer.append((tokens, seconds))
            self._fitted = None
        self._per_row = None

    @property
    def base(self) -> float | None:
        """Seconds of a 1-token pass (None until one is timed)."""
        return median(self._ones) if self._ones else None

    @property
    def slope(self) -> float | None:
        """Seconds per extra token of a pass (None until a longer pass and a 1-token pass are timed)."""
        return self._slope(self.base)

    def _slope(self, base: float | None) -> float | None:
        if base is None or not self._longer:
            return None
        return max(0.0, median((seconds - base) / (tokens - 1) for tokens, seconds in self._longer))

    def _fit(self) -> tuple[float, float] | None:
        """(base, slope) from the longer passes alone: Theil-Sen over pairs of different lengths; with one length
        only, the prior slope through their median."""
        if not self._longer:
            return None
        if self._fitted is None:
            pairs = [(s2 - s1) / (t2 - t1) for (t1, s1), (t2, s2) in combinations(self._longer, 2) if t1 != t2]
            if pairs:
                slope = max(0.0, median(pairs))
                base = median(s - slope * (t - 1) for t, s in self._longer)
            else:
                tokens, seconds = self._longer[0][0], median(s for _, s in self._longer)
                base = seconds / (1 + PRIOR_SLOPE * (tokens - 1))
                slope = PRIOR_SLOPE * base
            floor = 0.05 * median(s / t for t, s in self._longer)  # a fit through noise never makes passes free
            self._fitted = (max(base, floor), slope)
        return self._fitted

    def ratio(self, tokens: int) -> float:
        """cost(tokens) / cost(1)."""
        if self._per_row is None:
            self._per_row = self._slope_over_base()
        return 1 + self._per_row * (tokens - 1)

    def _slope_over_base(self) -> float:
        base = self.base
        if base is None and len({t for t, _ in self._longer}) > 1:  # only shared or verification passes so far
            base, slope = self._fit()
            return slope / base
        if base is None or base <= 0:
            return PRIOR_SLOPE
        slope = self._slope(base)
        return (slope if slope is not None else PRIOR_SLOPE * base) / base


class ModelledPassCost(PassCost):
    """A pass of T rows costs 1 + per_row x (T - 1) one-row passes whatever the clock says: speculation that
    verifies the same guesses on any machine, under any load (`PARLEY_ROW_COST`, `bench speculative
    --modelled`), so a run can be repeated token for token and pass for pass."""

    def __init__(self, per_row: float) -> None:
        super().__init__()
        self.per_row = per_row

    def add(self, tokens: int, seconds: float) -> None:
        pass

    def ratio(self, tokens: int) -> float:
        return 1 + self.per_row * (tokens - 1)


ROW_COST_ENV = "PARLEY_ROW_COST"


def pass_cost_from_env() -> PassCost:
    """`PassCost()` (measured as replies run), or the fixed model `PARLEY_ROW_COST` asks for."""
    value = os.environ.get(ROW_COST_ENV, "").strip()
    if not value:
        return PassCost()
    try:
        per_row = float(value)
    except ValueError:
        per_row = -1.0
    if not 0 <= per_row < float("inf"):
        raise ValueError(f"{ROW_COST_ENV}={value!r}: expected the cost of one more verified token in one-token "
                         "passes, a number >= 0 such as 0.2; unset it to measure the cost as replies run")
    return ModelledPassCost(per_row)


class PayCheck:
    """The `auto` mode's judgement of a dear drafter (a draft model: each guess costs a model pass) over one
    reply, revised as the reply goes on.

    The verdict is a model, not a stopwatch: each drafted round counts the tokens it decided (what landed,
    which the machine's load cannot change) against what the round is modelled to cost in plain rounds,
    (drafting + cost(1 + guesses)) / (overhead + cost(1)), with the pass cost from `PassCost`'s median fit
    and drafting and a plain round's overhead the medians of recent rounds. A stall (a busy neighbour, a
    slow first round) is one sample among many and moves no median, so it moves no verdict.

    On: after `min_rounds` drafted rounds, drafting goes on while the last `window` drafted rounds are
    modelled at least as fast as plain decoding. The first drafted round is never counted: it carries the
    drafter's one-off catching up with the prompt (a draft model's prefill). Off (paused): plain rounds, and
    the drafter is tried again after `backoff` plain rounds, twice as many each time it is paused.

    A cheap drafter (suffix match, prompt lookup: no model pass) is never judged here: a miss costs it only
    the verification of the guesses the cost model let through, `AdaptiveDraftLength` pauses it while it keeps
    missing, and each landed guess is a token gained. Pausing it as well threw gains away: on the held-out
    suite, `auto` with this check over suffix match made 2.21 to 2.91 tokens a pass where the same drafter
    unpaused made 2.98 to 3.37 (docs/speculation.md).
    """

    def __init__(self, cost: PassCost, min_rounds: int = 6, window: int = 12, backoff: int = 16) -> None:
        self.cost, self.min_rounds, self.window, self.backoff = cost, min_rounds, window, backoff
        self.rounds = 0  # drafted rounds since drafting (re)started
        self.note = ""  # why speculation is paused, in plain words ("" while it is on)
        self.pauses = 0  # how often this reply paused drafting
        self._warm = False
        self._recent: deque[tuple[int, int]] = deque(maxlen=window)  # drafted rounds: (guesses, tokens)
        self._drafting: deque[float] = deque(maxlen=SAMPLES)  # seconds of drafting a round's guesses
        self._overhead: deque[float] = deque(maxlen=SAMPLES)  # the same stretch of a plain round
        self._plain_rounds = 0  # plain rounds since the pause

    def add(self, drafted: int, tokens: int, seconds: float) -> None:
        """One round: `drafted` guesses verified, `tokens` decided; `seconds`: the time from the round's start
        to its pass (drafting, or a plain round's bookkeeping)."""
        if not drafted:
            self._plain_rounds += bool(self.note)
            self._overhead.append(seconds)
        elif not self._warm:
            self._warm = True  # its drafting time is the one-off catching up: not a sample either
        else:
            self.rounds += 1
            self._recent.append((drafted, tokens))
            self._drafting.append(seconds)

    def round_cost(self, guesses: int) -> float:
        """What a round verifying `guesses` guesses costs, in plain rounds (modelled; see the class)."""
        base = self.cost.base
        assert base is not None
        overhead = median(self._overhead) if self._overhead else 0.0
        drafting = median(self._drafting) if self._drafting else overhead
        return (drafting + base * self.cost.ratio(1 + guesses)) / max(1e-12, overhead + base)

    @property
    def needs_plain_round(self) -> bool:
        """True when a verdict is due but no 1-token round has been timed yet to compare with."""
        return self.rounds >= self.min_rounds and self.cost.base is None

    def pays(self) -> bool:
        """Whether to draft this round."""
        if self.note:
            if self._plain_rounds >= self.backoff * 2 ** (self.pauses - 1):
                self.note, self.rounds = "", 0  # tried again, judged afresh
                self._recent.clear()
            return not self.note
        if self.rounds < self.min_rounds or self.cost.base is None:
            return True
        speedup = self._speedup(self._recent)
        if speedup >= 1.0:
            return True
        self.pauses += 1
        per_pass = sum(t for _, t in self._recent) / len(self._recent)
        self.note = (f"speculation paused: guesses were too rarely right to pay ({per_pass:.1f} "
                     f"tokens per pass, {speedup:.2f}x plain decoding's speed); it is tried again as the reply goes on")
        self._plain_rounds = 0
        return False

    def _speedup(self, rounds: deque[tuple[int, int]]) -> float:
        """Tokens per modelled plain-round time of these rounds: plain decoding makes 1."""
        return sum(t for _, t in rounds) / sum(self.round_cost(g) for g, _ in rounds)


class AdaptiveDraftLength:
    """How many tokens to draft next round: k in [1, k_max] (k_max <= 16), or 0 while paused.

    k doubles after a fully accepted round (a long span copied from a pasted document reaches 16 in
    a few rounds) and drops to just past what was accepted after a rejection. This ramp bounds drafters whose
    guesses carry no scores (prompt lookup, a draft model); a scored drafter proposes up to k_max and the
    scheduler keeps the guesses worth their rows (`SpeculationPolicy.plan`). A drafter that keeps
    missing entirely is paused: after `patience` rounds in a row with nothing accepted, drafting stops
    for 1 round, then after each further fruitless try for 2, 4, ... up to `max_pause` rounds (any
    accepted token resets this), so a useless drafter costs little
    more than plain decoding (each failed guess makes the target verify a longer, dearer pass). The
    decision uses only past rounds, so it never biases what is emitted.
    """

    def __init__(self, k_max: int, k: int | None = None, patience: int = 3, max_pause: int = 32) -> None:
        self.k_max = k_max
        self._k = max(1, min(k or 4, k_max, 16))
        self.patience, self.max_pause = patience, max_pause
        self._misses = 0  # consecutive drafted rounds with nothing accepted
        self._pause = 0  # rounds left without drafting
        self._next_pause = 1
        self._declined, self._next_decline = False, 1  # the scheduler verified none of this round's guesses
        self._resting = False  # the pause is the scheduler's (declined guesses), not the drafter's misses

    @property
    def k(self) -> int:
        return 0 if self._pause else max(1, min(self._k, self.k_max, 16))

    def decline(self) -> None:
        """The scheduler verified none of this round's guesses: beside other replies they did not pay their share
        of the pass. Drafting then rests 1, 2, 4, ... rounds (up to `max_pause`; a round whose guesses are
        verified starts over), so a reply in a busy batch stops drafting guesses it is not given (a suffix
        match's proposal and the scheduler's sharing cost ~0.1 ms a round, 6% of a 4-reply step)."""
        self._declined = True

    @property
    def resumable(self) -> bool:
        """Paused after misses (not resting after the scheduler's declines): evidence of a coming copy ends it."""
        return bool(self._pause) and not self._resting

    def resume(self) -> None:
        """End a pause that misses began (not one the scheduler's declines did): the drafter has evidence that its
        next guesses land, e.g. a long match (`SpeculationPolicy.plan`). The back-off stays as it was."""
        if self.resumable:
            self._pause = 0

    def update(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            if self._declined:
                self._pause, self._declined, self._resting = self._next_decline, False, True
                self._next_decline = min(2 * self._next_decline, self.max_pause)
            else:
                self._pause = max(0, self._pause - 1)
            return
        self._next_decline = 1
        if accepted == 0:
            self._misses += 1
            # a drafter already paused once gets one try per resumption, not `patience`
            if self._misses >= (self.patience if self._next_pause == 1 else 1):
                self._pause, self._misses, self._resting = self._next_pause, 0, False
                self._next_pause = min(2 * self._next_pause, self.max_pause)
        else:
            self._misses, self._next_pause = 0, 1
        if accepted == proposed:
            self._k = min(max(self._k, proposed) * 2, 16)
        else:
            self._k = max(1, min(self._k - 1, accepted + 1))


# A pause after misses ends early where the context's end matches this many tokens earlier in it: a span that can
# be copied begins, where the back-off alone would resume up to 32 rounds late, wherever its phase fell (tokens a
# pass at temperature 0 on the held-out suite: GPL-3 2.00 -> 2.56, python json 1.58 -> 1.75, no prompt lower;
# 4 lowered man tar, 10 kept GPL-3 at 2.17).
RESUME_MATCH = 6


class SpeculationPolicy:
    """What one reply drafts each round, from what its earlier rounds measured: the draft length
    (`AdaptiveDraftLength`), `auto`'s verdict on a dear drafter (`PayCheck`), and how well the drafter's scores
    have predicted what landed (the calibration its scores are scaled by before the scheduler weighs them
    against the pass cost)."""

    def __init__(self, cost: PassCost, k_max: int) -> None:
        self.length = AdaptiveDraftLength(k_max)
        self.pay = PayCheck(cost)
        self._landed, self._expected = 0, 0.0  # guesses landed, and what the drafter's scores expected

    @property
    def calibration(self) -> float:
        return (self._landed + 1) / (self._expected + 1)

    @property
    def note(self) -> str:
        """Why drafting is paused, in plain words ("" while it is on)."""
        return self.pay.note

    def plan(self, drafter: Drafter | None, context: list[int], params: GenerationParams, room: int) -> int:
        """How many tokens `drafter` guesses this round (0: a plain round); `room`: the most the reply's budget
        and the window leave. Under `auto` a dear drafter that `PayCheck` paused runs plain rounds (or one that
        measures a 1-token pass to compare with)."""
        self.length.k_max = params.draft_tokens
        if drafter is None:
            return 0
        if params.speculation == "auto" and not drafter.cheap and (self.pay.needs_plain_round
                                                                   or not self.pay.pays()):
            return 0
        match = getattr(drafter, "match_length", None)  # suffix match's: prompt lookup and draft models wait
        # only where a match can end the pause: resting after declines, beside 7 other replies the probe (~0.05 ms a
        # round, the trie cold after every pass) cost each of them every round
        if self.length.resumable and match is not None and match(context) >= RESUME_MATCH:
            self.length.resume()
        if drafter.scored and self.length.k:
            # Scored guesses are cut against the measured pass cost (`share_guesses`), so the ramp's only effect
            # would be a copy started late: after one miss it drafts 1, 2, 4, 8 before 16 again (on the MPL-2.0
            # licence two rounds behind prompt lookup; held-out suite, temperature 0: tokens a pass 9.14 ->
            # 10.67 there, GPL-3 2.56 -> 2.98, man grep 4.74 -> 5.33, none lower).
            return min(self.length.k_max, 16, room)
        return min(self.length.k, room)

    def declined(self) -> None:
        """The scheduler verified none of this round's guesses (`AdaptiveDraftLength.decline`)."""
        self.length.decline()

    def scores(self, guess: Proposal) -> list[float]:
        """The chance that each prefix of `guess` lands, as this reply's guesses have landed so far."""
        return [min(1.0, s * self.calibration) for s in guess.scores or ()]

    def learn(self, guess: Proposal, new: list[int], depth: int, seconds: float) -> None:
        """A round ran: `guess` verified (`depth` levels deep), `new` the tokens it decided; `seconds` from the
        round's start to its pass (drafting, or a plain round's bookkeeping)."""
        self.length.update(depth, len(new) - 1)
        self.pay.add(len(guess), len(new), seconds)
        if guess.scores:
            self._landed += len(new) - 1
            self._expected += sum(guess.scores)
