"""`sample` draws each token with its probability (chi-square over many seeded draws), never a
zero-probability one, and the one token of a one-hot distribution always."""

from __future__ import annotations

import torch

from parley.engine.sampling import make_generator, sample

SEED = 1234


def test_draws_follow_the_distribution_and_skip_zeros() -> None:
    p = torch.tensor([0.0, 0.5, 0.0, 0.25, 0.125, 0.0625, 0.0625, 0.0])
    g = make_generator(SEED)
    n = 40_000
    counts = torch.zeros(len(p))
    for _ in range(n):
        counts[sample(p, g)] += 1
    assert counts[p == 0].sum() == 0, f"seed {SEED}: drew a zero-probability token: {counts.tolist()}"
    expected = p[p > 0] * n
    chi2 = (((counts[p > 0] - expected) ** 2) / expected).sum().item()
    assert chi2 < 22.5, f"seed {SEED}: chi-square {chi2:.1f} over 5 dof (p < 0.001): {counts.tolist()}"


def test_one_hot_over_a_large_vocabulary_always_gives_its_token() -> None:
    g = make_generator(SEED)
    for token in (0, 17, 49_151):
        p = torch.zeros(49_152)
        p[token] = 1.0
        assert all(sample(p, g) == token for _ in range(50)), f"seed {SEED}"


def test_the_last_token_can_be_drawn() -> None:
    """No off-by-one at the end of the cumulative sum."""
    p = torch.zeros(1000)
    p[-1], p[0] = 0.5, 0.5
    g = make_generator(SEED)
    assert {sample(p, g) for _ in range(200)} == {0, 999}, f"seed {SEED}"
