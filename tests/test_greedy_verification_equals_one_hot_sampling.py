"""At temperature 0 the reply loop takes each row's argmax (`sampling.greedy`, `verify_greedy`) instead of
building the one-hot distribution and drawing from it (`sampling.probs`, `verify`). Pinned: the same tokens for
every draft (all kept, a miss at each position, none), with and without penalties, ties included, and the same
draws from the generator, so a seeded reply whose temperature is raised after greedy rounds samples what it
sampled before."""

from __future__ import annotations

import random

import pytest
import torch

from parley.engine import sampling
from parley.engine.params import GenerationParams
from parley.engine.speculative import verify, verify_greedy

V = 50


def _cases(seed: int):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    for _ in range(40):
        k = rng.randrange(0, 6)
        logits = torch.randn(k + 1, V, generator=g)
        if rng.random() < 0.3:  # a tie for the maximum: the lower index is the argmax either way
            row = rng.randrange(k + 1)
            a, b = rng.sample(range(V), 2)
            logits[row, a] = logits[row, b] = logits[row].max() + 1
        history = [rng.randrange(V) for _ in range(rng.randrange(0, 12))]
        yield k, logits, history, rng


@pytest.mark.parametrize("penalties", [False, True], ids=["plain", "penalised"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_verification_emits_and_draws_what_one_hot_sampling_does(seed: int, penalties: bool) -> None:
    params = GenerationParams(temperature=0.0, repeat_penalty=1.3 if penalties else 1.0,
                              frequency_penalty=0.4 if penalties else 0.0, repeat_last_n=8)
    for k, logits, history, rng in _cases(seed):
        # the draft the target would keep (each row's argmax given the draft before it), then a miss at a random
        # position, or no miss at all
        draft: list[int] = []
        for i in range(k):  # row i alone after the history and the draft before it, as plain decoding reads it
            draft += sampling.greedy(logits[i : i + 1], params, history=history + draft)
        if k and rng.random() < 0.7:
            at = rng.randrange(k)
            draft[at] = (draft[at] + 1 + rng.randrange(V - 1)) % V
        best = sampling.greedy(logits, params, history=history, drafted=draft)
        p = sampling.probs(logits, params, history=history, drafted=draft)
        assert best == p.argmax(-1).tolist(), f"seed {seed}"
        g1 = torch.Generator().manual_seed(seed)
        g2 = torch.Generator().manual_seed(seed)
        want = verify(p, draft, None, g1)
        got = verify_greedy(best, draft, g2)
        assert got == want, f"seed {seed}: draft {draft}, one-hot sampling {want}, greedy {got}"
        assert torch.rand(3, generator=g1).tolist() == torch.rand(3, generator=g2).tolist(), (
            f"seed {seed}: the greedy path drew the generator differently")


def test_a_seeded_reply_raised_from_greedy_samples_what_it_would_after_near_greedy_rounds() -> None:
    """End to end: a seeded reply's greedy rounds draw from its generator as sampled rounds do (one draw a token),
    so raising its temperature after three greedy tokens samples what it samples after three tokens at a
    temperature so low that each draw lands on the argmax. (A reply without a seed skips those draws: nobody can
    replay its generator.)"""
    from tiny import tiny_engine

    from parley.engine.events import TextDelta

    eng = tiny_engine()
    eng.tokenizer.stop_ids = frozenset()

    def reply(first_temperature: float) -> list[str]:
        eng.reset_cache()
        live = GenerationParams(temperature=first_temperature, top_p=1.0, max_new_tokens=24, seed=11,
                                speculation="off")
        got: list[str] = []
        for ev in eng.session().reply([{"role": "user", "content": "q"}], live):
            if isinstance(ev, TextDelta):
                got.append(ev.text)
                if len(got) == 3:
                    live.temperature = 2.0
        return got

    greedy, near = reply(0.0), reply(1e-3)
    assert near[:3] == greedy[:3], "the near-greedy rounds should take the argmax (the test's premise)"
    assert greedy == near, "after three greedy tokens the generator is not where three sampled tokens leave it"
