"""sampling.probs applies temperature, top-k, top-p and min-p exactly, one transform at a time (the
combinations: test_sampling_matches_float64_reference.py)."""

import torch

from parley.engine.params import GenerationParams
from parley.engine.sampling import make_generator, probs, sample

LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])


def test_temperature_zero_is_one_hot_argmax():
    p = probs(LOGITS, GenerationParams(temperature=0))
    assert p.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]


def test_temperature_scales_softmax():
    p = probs(LOGITS, GenerationParams(temperature=0.5, top_p=1.0))
    torch.testing.assert_close(p, torch.softmax(LOGITS / 0.5, -1))


def test_top_k_keeps_k_largest():
    p = probs(LOGITS, GenerationParams(temperature=1.0, top_p=1.0, top_k=2))
    torch.testing.assert_close(p, torch.tensor([[*torch.softmax(LOGITS[0, :2], -1).tolist(), 0, 0, 0]]))


def test_top_p_keeps_smallest_set_covering_p():
    base = torch.softmax(LOGITS, -1)[0]  # ~[.53, .20, .12, .07, .03]
    p = probs(LOGITS, GenerationParams(temperature=1.0, top_p=0.7))
    kept = base[:2] / base[:2].sum()  # .53 < .7 <= .73
    torch.testing.assert_close(p[0], torch.cat([kept, torch.zeros(3)]))
    # a single token covering top_p alone is kept alone
    assert probs(LOGITS, GenerationParams(temperature=1.0, top_p=0.5))[0].tolist() == [1, 0, 0, 0, 0]


def test_min_p_drops_tokens_below_fraction_of_max():
    base = torch.softmax(LOGITS, -1)[0]
    p = probs(LOGITS, GenerationParams(temperature=1.0, top_p=1.0, min_p=0.3))
    keep = base >= 0.3 * base.max()
    torch.testing.assert_close(p[0], torch.where(keep, base, 0) / base[keep].sum())


def test_seeded_sampler_repeats():
    p = torch.softmax(torch.randn(1000), -1)
    a = [sample(p, g) for g in [make_generator(5)] for _ in range(20)]
    b = [sample(p, g) for g in [make_generator(5)] for _ in range(20)]
    assert a == b
