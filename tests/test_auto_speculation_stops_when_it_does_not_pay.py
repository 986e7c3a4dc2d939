"""`auto` turns drafting off for the rest of a reply once its measured tokens per second fall below
plain decoding's, says so in `Stats.speculation_note`, and keeps a drafter that pays. The rounds are
timed by a fake clock (each read advances it by one plain pass; each guess adds a fifth of that), so
the verdicts do not depend on the machine; the replies stay token-identical to plain decoding."""

import pytest
from single_thread import single_thread  # noqa: F401
from tiny import tiny_engine

from parley.engine import session as session_module
from parley.engine.events import Stats
from parley.engine.params import GenerationParams
from parley.engine.speculation_pay import PassCost

PARAMS = GenerationParams(temperature=0, max_new_tokens=60, draft_tokens=4, speculation="auto")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0  # a read a step: a 1-token pass (between two reads) costs 1.0
        return self.t


class Guesser:
    """Proposes the plain reply's next tokens (right), or each of them plus one (always wrong)."""

    def __init__(self, prompt_len: int, reply: list[int], clock: Clock, right: bool) -> None:
        self.start, self.reply, self.clock, self.right = prompt_len, reply, clock, right
        self.name = "right guesses" if right else "wrong guesses"

    def propose(self, context, k, params=None, generator=None):
        done = len(context) - self.start  # reply tokens already decided (the context ends with the newest)
        guesses = self.reply[done : done + k]
        self.clock.t += 0.2 * len(guesses)  # each guess makes the round dearer by a fifth of a plain pass
        return (guesses if self.right else [(t + 1) % 256 for t in guesses]), None


def run(eng, params):
    session = eng.session()
    events = list(session.reply([{"role": "user", "content": "tell me a story"}], params))
    return session.reply_ids, [e for e in events if isinstance(e, Stats)][-1]


@pytest.mark.parametrize("right", [False, True], ids=["wrong_guesses", "right_guesses"])
def test_auto_keeps_drafting_only_while_it_pays(monkeypatch, right):
    eng = tiny_engine(seed=4)
    eng.tokenizer.stop_ids = frozenset()
    plain, stats = run(eng, GenerationParams(**{**PARAMS.__dict__, "speculation": "off"}))
    assert stats.drafter == "" and stats.speculation_note == "" and len(plain) == PARAMS.max_new_tokens
    clock = Clock()
    monkeypatch.setattr(session_module, "round_clock", clock)
    eng.pass_cost = PassCost()  # forget the plain reply's rounds, timed by the real clock
    prompt_len = len(eng.tokenizer.encode_chat([{"role": "user", "content": "tell me a story"}]))
    guesser = Guesser(prompt_len, plain, clock, right)
    monkeypatch.setattr(eng, "drafter", lambda mode: guesser if mode != "off" else None)

    got, stats = run(eng, PARAMS)
    assert got == plain
    assert stats.drafter == guesser.name
    if right:  # 5 tokens in 2.8 pass times (4 guesses + one more read): drafting pays and stays on
        assert stats.speculation_note == "" and stats.tokens_per_target_pass > 3, stats
    else:
        assert "turned off" in stats.speculation_note, stats
        proposed_at_verdict = stats.proposed
        assert proposed_at_verdict < 40, stats  # stopped early, not merely paused
        # the same guesser under an explicit mode is not judged: it keeps trying (paused between misses)
        got, forced = run(eng, GenerationParams(**{**PARAMS.__dict__, "speculation": "suffix"}))
        assert got == plain and forced.speculation_note == "" and forced.proposed > proposed_at_verdict, forced
