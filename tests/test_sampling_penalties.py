"""Repetition penalties: llama.cpp's repeat penalty and OpenAI's frequency / presence penalties over
the last `repeat_last_n` tokens, and a verification batch penalising each drafted position with the
context plain decoding would have had there."""

import random

import pytest
import torch

from parley.engine.params import GenerationParams
from parley.engine.sampling import penalize, probs

LOGITS = torch.tensor([2.0, -2.0, 0.0, 1.0, 3.0])


def pen(history, **kw):
    return penalize(LOGITS, GenerationParams(**kw), history, []).tolist()


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits_once_per_token():
    # Token 0 appears twice and is divided once; 1 is negative, multiplied; 2 is zero, stays zero.
    assert pen([0, 1, 0, 2], repeat_penalty=2.0) == [1.0, -4.0, 0.0, 1.0, 3.0]


def test_frequency_and_presence_penalties_count_occurrences():
    assert pen([0, 1, 0], frequency_penalty=0.5, presence_penalty=0.25) == [0.75, -2.75, 0.0, 1.0, 3.0]


def test_window_is_the_last_n_tokens():
    history = [4, 0, 1, 0]
    assert pen(history, repeat_penalty=2.0, repeat_last_n=2) == [1.0, -4.0, 0.0, 1.0, 3.0]
    assert pen(history, repeat_penalty=2.0, repeat_last_n=-1) == [1.0, -4.0, 0.0, 1.0, 1.5]
    assert pen(history, repeat_penalty=2.0, repeat_last_n=0) == LOGITS.tolist()
    assert pen(history, repeat_penalty=2.0, repeat_last_n=100) == [1.0, -4.0, 0.0, 1.0, 1.5]


def test_greedy_takes_the_argmax_after_penalties():
    p = probs(LOGITS[None], GenerationParams(temperature=0, repeat_penalty=1.5), history=[4])
    assert p[0].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]  # 3 / 1.5 = 2 ties 2.0: the first maximum wins


@pytest.mark.parametrize("last_n", [-1, 3, 64])
def test_rows_with_drafted_tokens_equal_rows_computed_one_at_a_time(last_n):
    """Row i of a verification batch is what plain decoding computes after history + drafted[:i]."""
    for seed in range(20):
        rng = random.Random(seed)
        g = torch.Generator().manual_seed(seed)
        v, t = 300, rng.randint(2, 17)
        logits = torch.randn(t, v, generator=g) * 3
        history = [rng.randrange(20) for _ in range(rng.randint(0, 80))]
        drafted = [rng.randrange(20) for _ in range(t - 1)]
        params = GenerationParams(temperature=rng.choice([0.0, 0.7]), top_p=0.9, top_k=rng.choice([0, 50]),
                                  min_p=0.02, repeat_penalty=1.3, repeat_last_n=last_n,
                                  frequency_penalty=0.2, presence_penalty=0.1)
        batch = probs(logits, params, history=history, drafted=drafted)
        for i in range(t):
            alone = probs(logits[i : i + 1], params, history=history + drafted[:i])
            assert torch.equal(batch[i : i + 1], alone), f"seed {seed}, row {i} of {t}, last_n {last_n}"


def test_rows_need_the_drafted_tokens_they_follow():
    with pytest.raises(ValueError, match="need the 2 drafted tokens"):
        probs(torch.zeros(3, 5), GenerationParams(repeat_penalty=1.3), history=[1], drafted=[2])


def test_penalties_off_leave_logits_untouched():
    logits = torch.randn(4, 50)
    assert penalize(logits, GenerationParams(), [1, 2, 3], [4, 5, 6]) is logits
