"""A round verifies with the params snapshot it started with: a change made while the round runs (the
UI thread moving a slider during the forward pass) applies from the next round, never to the tokens
this round decides (issue 10, mutant 4: verification reading a fresh snapshot)."""

from single_thread import single_thread  # noqa: F401
from tiny import tiny_engine

from parley.engine.events import TextDelta
from parley.engine.params import GenerationParams
from parley.engine.speculative import Proposal


class SliderMidRound:
    """A drafter that proposes nothing and, as a stand-in for the UI thread, sets the live temperature
    high while the round is in flight; the test sets it back to 0 between rounds."""

    name = "slider"
    cheap = False
    scored = False

    def __init__(self, live: GenerationParams) -> None:
        self.live = live
        self.calls = 0

    def propose(self, context, k, params, generator=None):
        self.calls += 1
        self.live.temperature, self.live.top_p = 5.0, 1.0
        return Proposal()


def test_a_change_inside_a_round_does_not_alter_that_round():
    eng = tiny_engine(seed=2)
    eng.tokenizer.stop_ids = frozenset()
    messages = [{"role": "user", "content": "once upon a time"}]
    greedy = GenerationParams(temperature=0, max_new_tokens=30, speculation="off", seed=1)
    want = "".join(e.text for e in eng.session().reply(messages, greedy) if isinstance(e, TextDelta))

    live = GenerationParams(temperature=0, max_new_tokens=30, speculation="draft", seed=1)
    eng.draft = slider = SliderMidRound(live)
    got = ""
    for ev in eng.session().reply(messages, live):
        if isinstance(ev, TextDelta):
            got += ev.text
            live.temperature = 0.0  # between rounds: the next snapshot is greedy again
    assert slider.calls == 29  # every round but the last (no budget left to draft) moved the slider
    assert got == want
