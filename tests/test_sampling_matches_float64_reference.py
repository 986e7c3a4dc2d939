"""sampling.probs equals an independent float64 implementation with every transform on at once:
penalties over a window that slides across drafted positions, temperature != 1, top-k, top-p, min-p.

The reference below is written from the definitions in plain Python floats, one row and one token at
a time, and shares no code with parley.engine.sampling. Each case draws its logits, context and
parameters from its own seed, printed with the parameters on failure.

Besides the random cases, three hand-made cases pin orderings that a one-transform-at-a-time test at
temperature 1 cannot see (mutants 5, 6 and 7 of issue 10 each passed such tests).
"""

import math
import random
from collections import Counter

import torch

from parley.engine.params import GenerationParams
from parley.engine.sampling import probs

CASES = 400
V = 48


def reference(logits: list[float], params: GenerationParams, context: list[int]) -> list[float]:
    """The distribution of the next token after `context`, from the definitions."""
    x = list(logits)
    n = params.repeat_last_n
    window = [] if n == 0 else context if n < 0 else context[-n:]
    for tok, count in Counter(window).items():  # llama.cpp: each distinct token penalised once
        x[tok] = x[tok] / params.repeat_penalty if x[tok] > 0 else x[tok] * params.repeat_penalty
        x[tok] -= count * params.frequency_penalty + params.presence_penalty  # OpenAI
    if params.temperature == 0:
        best = max(range(len(x)), key=lambda i: (x[i], -i))  # the first of equal maxima
        return [float(i == best) for i in range(len(x))]
    x = [v / params.temperature for v in x]
    if params.top_k:
        kth = sorted(x, reverse=True)[min(params.top_k, len(x)) - 1]
        x = [v if v >= kth else -math.inf for v in x]
    top = max(x)
    e = [math.exp(v - top) for v in x]
    p = [v / sum(e) for v in e]
    if params.top_p < 1:  # keep a token when the tokens more probable than it cover less than top_p
        p = [pi if sum(pj for pj in p if pj > pi) < params.top_p else 0.0 for pi in p]
        p = [pi / sum(p) for pi in p]
    if params.min_p:  # against the largest probability of the tempered nucleus
        p = [pi if pi >= params.min_p * max(p) else 0.0 for pi in p]
    return [pi / sum(p) for pi in p]


def random_case(seed: int):
    rng = random.Random(seed)
    rows = rng.randint(1, 5)
    words = rng.sample(range(V), 10)  # a few distinct tokens, so contexts repeat some of them
    history = [rng.choice(words) for _ in range(rng.randint(0, 30))]
    drafted = [rng.choice(words) for _ in range(rows - 1)]
    params = GenerationParams(
        temperature=rng.choice([0.0, 0.3, 0.7, 1.0, 1.6, 3.0]),
        top_k=rng.choice([0, 0, 1, 5, 20]),
        top_p=rng.choice([1.0, 0.5, 0.8, 0.9, 0.97]),
        min_p=rng.choice([0.0, 0.0, 0.05, 0.1, 0.3]),
        repeat_penalty=rng.choice([1.0, 1.1, 1.3, 2.0, 0.8]),
        repeat_last_n=rng.choice([-1, 0, 1, 3, 8, 64]),
        frequency_penalty=rng.choice([0.0, 0.0, 0.5, -0.3]),
        presence_penalty=rng.choice([0.0, 0.0, 0.4, 1.5]),
    )
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, V, generator=g) * rng.choice([0.5, 2.0, 4.0])
    return logits, params, history, drafted


def test_probs_matches_reference_on_random_cases():
    for seed in range(CASES):
        logits, params, history, drafted = random_case(seed)
        got = probs(logits, params, history=history, drafted=drafted)
        for i in range(len(logits)):
            want = torch.tensor(reference(logits[i].tolist(), params, history + drafted[:i]), dtype=torch.float64)
            where = f"seed {seed}, row {i}: {params}, history {history}, drafted {drafted}"
            assert torch.equal(got[i] > 0, want > 0), f"kept tokens differ at {where}"
            torch.testing.assert_close(got[i].double(), want, rtol=1e-5, atol=1e-7, msg=lambda m, w=where: f"{w}\n{m}")


LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
# softmax(LOGITS)     ~ [.563, .207, .126, .076, .028]
# softmax(LOGITS / 2) ~ [.374, .227, .177, .138, .084]


def kept(p: torch.Tensor) -> set[int]:
    return set(torch.nonzero(p[0]).flatten().tolist())


def test_nucleus_is_taken_after_temperature():
    """Pins: top-p chooses its nucleus from the tempered distribution (mutant 7 chose it before
    temperature: at T = 1 the first two tokens already cover 0.7, at T = 2 it takes three)."""
    p = probs(LOGITS, GenerationParams(temperature=2.0, top_p=0.7))
    assert kept(p) == {0, 1, 2}


def test_min_p_is_measured_against_the_tempered_maximum():
    """Pins: min-p compares with the top probability after temperature (mutant 6 used the maximum
    before temperature: 0.3 x .563 = .169 would drop token 3's .138; 0.3 x .374 = .112 keeps it)."""
    params = GenerationParams(temperature=2.0, top_p=1.0, min_p=0.3)
    assert kept(probs(LOGITS, params)) == {0, 1, 2, 3}


def test_min_p_is_measured_in_the_same_units_as_the_nucleus():
    """Pins: min-p after top-p compares probabilities with their own maximum (mutant 5 compared the
    nucleus' probabilities with the maximum of the renormalised nucleus, .374 / .916 = .408: 0.35 x .408
    = .143 would drop token 3's .138; 0.35 x .374 = .131 keeps it)."""
    params = GenerationParams(temperature=2.0, top_p=0.9, min_p=0.35)
    assert kept(probs(LOGITS, params)) == {0, 1, 2, 3}
