"""`auto` chooses among its cheap drafters round by round: every candidate guesses for the same context, each
chain is scored against the tokens the round decided, and the next round verifies the candidate that has landed
more. A drafter listed second whose guesses are right takes over from a first one whose guesses are wrong; the
reply stays token-identical to plain decoding whichever is verified. Rounds are timed by a fake clock (in which
guessing costs nothing, as a trie walk or a dict lookup next to a pass), so the choice does not depend on the
machine."""

import pytest
import test_auto_speculation_pauses_and_resumes as pauses
from single_thread import single_thread  # noqa: F401
from test_auto_speculation_pauses_and_resumes import PARAMS, Clock, Guesser, run
from tiny import tiny_engine

from parley.engine import scheduler as scheduler_module
from parley.engine.params import GenerationParams
from parley.engine.speculation_pay import PassCost, SpeculationPolicy
from parley.engine.speculative import Proposal


@pytest.fixture()
def engine_and_plain():
    eng = tiny_engine(seed=4)
    eng.tokenizer.stop_ids = frozenset()
    plain, _ = run(eng, GenerationParams(**{**PARAMS.__dict__, "speculation": "off"}))
    prompt_len = len(eng.tokenizer.encode_chat([{"role": "user", "content": "tell me a story"}]))
    return eng, plain, prompt_len


@pytest.mark.parametrize("order", ["wrong first", "right first"])
def test_the_drafter_whose_guesses_land_is_verified(engine_and_plain, monkeypatch, order):
    eng, plain, prompt_len = engine_and_plain
    clock = Clock()
    monkeypatch.setattr(scheduler_module, "round_clock", clock)
    monkeypatch.setattr(pauses, "GUESS", 0.0)  # guessing costs no pass, as for suffix match and prompt lookup
    eng.pass_cost = PassCost()
    wrong = Guesser(prompt_len, plain, clock, "wrong", cheap=True)
    right = Guesser(prompt_len, plain, clock, "right", cheap=True)
    pair = [wrong, right] if order == "wrong first" else [right, wrong]
    monkeypatch.setattr(eng, "drafters", lambda mode: pair if mode == "auto" else [])
    got, stats = run(eng, PARAMS)
    assert got == plain
    assert stats.drafter == right.name, stats
    assert stats.speculation_note == "" and stats.tokens_per_target_pass > 3, stats


class Fixed:
    """A drafter that always proposes the same chain."""

    cheap = True

    def __init__(self, name: str, chain: list[int]) -> None:
        self.name, self.chain = name, chain

    def propose(self, context, k, params=None, generator=None) -> Proposal:
        return Proposal(self.chain[:k])


def policy_and_params() -> tuple[SpeculationPolicy, GenerationParams]:
    cost = PassCost()
    for _ in range(3):
        cost.add(1, 1.0)
        cost.add(5, 1.0)  # passes of any length cost the same: a round's rate is 1 + its guesses matched
    return SpeculationPolicy(cost, k_max=4), GenerationParams(speculation="auto", draft_tokens=4)


def test_scores_count_guesses_up_to_where_the_decided_tokens_end():
    policy, params = policy_and_params()
    short, long = Fixed("short", [1, 2]), Fixed("long", [1, 2, 3, 4])
    k, drafter = policy.plan([short, long], [0], params, room=4)
    assert (k, drafter) == (4, short)  # nothing measured yet: the first candidate
    policy.learn(drafter.propose([0], k), [1, 2, 3], depth=2, seconds=1.0)  # both of short's guesses landed
    # `long` matched three (the decided tokens end there), `short` two: `long` is verified next
    assert policy.plan([short, long], [0], params, room=4)[1] is long


def test_a_tie_keeps_the_drafter_verified():
    policy, params = policy_and_params()
    first, second = Fixed("first", [1, 2, 9]), Fixed("second", [1, 2, 8])
    for _ in range(20):  # both land two guesses every round
        k, drafter = policy.plan([first, second], [0], params, room=4)
        assert drafter is first
        policy.learn(drafter.propose([0], k), [1, 2, 3], depth=3, seconds=1.0)
