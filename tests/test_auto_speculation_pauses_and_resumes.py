"""`auto` pauses a draft model once its modelled tokens per second fall below plain decoding's (and says so
in `Stats.speculation_note`), keeps a drafter that pays, and tries a paused one again after a growing back-off
within the same reply; a cheap drafter (suffix match, prompt lookup) drafts under `auto` exactly as under its
own mode. The
rounds are timed by a fake clock (each read advances it by one 1-token pass, so a plain round, its bookkeeping
and its pass, costs 2; each guess adds 1.5), so the verdicts do not depend on the machine; every reply stays
token-identical to plain decoding. The same replies with stalls planted in the clock (a busy neighbour: every
tenth read 50 passes late) reach the same verdicts at the same tokens: they rest on tokens per pass against a
median-fitted cost model, not on a few rounds' wall time (issue 33)."""

import pytest
from single_thread import single_thread  # noqa: F401
from tiny import tiny_engine

from parley.engine import scheduler as scheduler_module
from parley.engine.events import Stats
from parley.engine.params import GenerationParams
from parley.engine.speculation_pay import PassCost
from parley.engine.speculative import Proposal

PARAMS = GenerationParams(temperature=0, max_new_tokens=200, draft_tokens=4, speculation="auto")
SWITCH = 50  # "wrong, then right" guessers start guessing right at this many reply tokens


GUESS = 1.5  # what drafting one guess costs, in 1-token passes


class Clock:
    def __init__(self, stall_every: int = 0) -> None:
        self.t, self.reads, self.stall_every = 0.0, 0, stall_every

    def __call__(self) -> float:
        self.t += 1.0  # a read a step: a 1-token pass (between two reads) costs 1.0
        self.reads += 1
        if self.stall_every and self.reads % self.stall_every == 0:
            self.t += 50.0  # the machine was busy elsewhere
        return self.t


class Guesser:
    """Proposes the plain reply's next tokens (right), or each of them plus one (wrong); `when` says which
    by reply position ("first right": only the first guess of each proposal is right, too few to pay for
    the rest). `cheap` as the suffix and prompt-lookup drafters are (no model pass)."""

    def __init__(self, prompt_len: int, reply: list[int], clock: Clock, when: str, cheap: bool) -> None:
        self.start, self.reply, self.clock, self.when, self.cheap = prompt_len, reply, clock, when, cheap
        self.scored = False  # as prompt lookup: the ramp bounds its guesses
        self.name = f"{when} guesses"
        self.calls: list[tuple[int, int]] = []  # (reply tokens decided, guesses) per proposal

    def right(self, done: int) -> bool:
        return self.when == "right" or (self.when == "wrong then right" and done >= SWITCH)

    def propose(self, context, k, params=None, generator=None):
        done = len(context) - self.start  # reply tokens already decided (the context ends with the newest)
        guesses = self.reply[done : done + k]
        self.clock.t += GUESS * len(guesses)
        self.calls.append((done, len(guesses)))
        if self.when == "first right":
            return Proposal(guesses[:1] + [(t + 1) % 256 for t in guesses[1:]])
        return Proposal(guesses if self.right(done) else [(t + 1) % 256 for t in guesses])


def run(eng, params):
    session = eng.session()
    events = list(session.reply([{"role": "user", "content": "tell me a story"}], params))
    return session.reply_ids, [e for e in events if isinstance(e, Stats)][-1]


@pytest.fixture()
def setup(monkeypatch):
    eng = tiny_engine(seed=4)
    eng.tokenizer.stop_ids = frozenset()
    plain, stats = run(eng, GenerationParams(**{**PARAMS.__dict__, "speculation": "off"}))
    assert stats.drafter == "" and stats.speculation_note == "" and len(plain) == PARAMS.max_new_tokens
    prompt_len = len(eng.tokenizer.encode_chat([{"role": "user", "content": "tell me a story"}]))

    def with_guesser(when: str, cheap: bool, stall_every: int = 0) -> Guesser:
        clock = Clock(stall_every)
        monkeypatch.setattr(scheduler_module, "round_clock", clock)
        eng.pass_cost = PassCost()  # forget earlier rounds (the plain reply's were timed by the real clock)
        guesser = Guesser(prompt_len, plain, clock, when, cheap)
        monkeypatch.setattr(eng, "drafter", lambda mode: guesser if mode != "off" else None)
        return guesser

    return eng, plain, with_guesser


@pytest.mark.parametrize("cheap", [True, False], ids=["cheap", "dear"])
def test_right_guesses_keep_drafting_on(setup, cheap):
    eng, plain, with_guesser = setup
    guesser = with_guesser("right", cheap)
    got, stats = run(eng, PARAMS)
    assert got == plain and stats.drafter == guesser.name
    assert stats.speculation_note == "" and stats.tokens_per_target_pass > 3, stats


@pytest.mark.parametrize("when", ["wrong", "wrong then right", "first right"])
def test_a_cheap_drafter_drafts_under_auto_as_under_its_own_mode(setup, when):
    """Suffix match and prompt lookup are never paused by the pay check: a miss costs them only the guesses the
    cost model let through, and `AdaptiveDraftLength` already pauses a drafter that keeps missing. So `auto`
    proposes at exactly the rounds, and verifies exactly the guesses, its fixed mode would."""
    eng, plain, with_guesser = setup
    auto = with_guesser(when, cheap=True)
    got, stats = run(eng, PARAMS)
    fixed = with_guesser(when, cheap=True)
    forced_got, forced = run(eng, GenerationParams(**{**PARAMS.__dict__, "speculation": "suffix"}))
    assert got == forced_got == plain
    assert auto.calls == fixed.calls, (when, auto.calls, fixed.calls)
    assert (stats.proposed, stats.accepted, stats.speculation_note) == (forced.proposed, forced.accepted, ""), stats
    if when == "wrong then right":  # from the first proposal after the switch (once the back-off between misses
        # ends), the reply is drafted: a drafted round accepts up to 4 and adds 1, after k's ramp
        resumed = next(done for done, _ in auto.calls if done >= SWITCH)
        assert stats.accepted >= 0.75 * (PARAMS.max_new_tokens - resumed - 8), (stats, auto.calls)
    if when == "wrong":  # misses back off: far fewer proposals than rounds
        assert len(auto.calls) < PARAMS.max_new_tokens / 4, auto.calls


def test_a_dear_drafter_is_retried_after_a_growing_back_off(setup):
    eng, plain, with_guesser = setup
    guesser = with_guesser("first right", cheap=False)  # each round lands one guess: never paused by misses
    got, stats = run(eng, PARAMS)
    assert got == plain
    starts = [done for done, _ in guesser.calls]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    waits = [g for g in gaps if g > 2]  # paused after 6 judged rounds, each time: 16 plain rounds, 32, 64
    assert len(waits) == 3 and all(w > 16 * 2**i for i, w in enumerate(waits)), (starts, gaps)
    assert "paused" in stats.speculation_note, stats


@pytest.mark.parametrize("when, cheap", [("right", True), ("wrong", True), ("wrong", False),
                                         ("wrong then right", False), ("first right", False)])
def test_stalls_leave_every_verdict_unchanged(setup, when, cheap):
    eng, plain, with_guesser = setup
    quiet = with_guesser(when, cheap)
    _, calm = run(eng, PARAMS)
    busy = with_guesser(when, cheap, stall_every=10)
    got, stalled = run(eng, PARAMS)
    assert got == plain
    assert busy.clock.t > 2 * quiet.clock.t  # the stalls happened (and made the reply more than twice as slow)
    # the same proposals at the same reply positions: every pause and resumption where it was
    assert busy.calls == quiet.calls, (when, quiet.calls, busy.calls)
    assert (stalled.proposed, stalled.accepted, bool(stalled.speculation_note)) == (
        calm.proposed, calm.accepted, bool(calm.speculation_note))
