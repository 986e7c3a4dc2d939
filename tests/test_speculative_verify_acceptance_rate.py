"""`verify` accepts a guess x with probability exactly min(1, p(x)/q(x)), also when p/q is close to 1.

Whole-reply chi-square tests cannot resolve a shift of <= 1% in the acceptance rate, so `verify` is called
directly here: one guess, 20,000 seeded draws per case, at p/q in {0.5, 0.99, 0.995}, for a deterministic
drafter (prompt lookup: q one-hot) and a sampling one (a draft model's q). The count of accepted guesses is
binomial(N, min(1, p/q)); the test fails below a two-sided exact p-value of 1e-4. Seeds are fixed, so the test
is deterministic. Power: a verifier that accepts outright when p >= 0.99 q rejects 0 guesses at p/q = 0.995
where the law expects 100 (p-value ~1e-44); confirmed by planting it (scripts/mutants.py).
A rejected guess is replaced by a draw from normalize(max(0, p - q)), which never gives x back.
"""

from __future__ import annotations

import math

import pytest
import torch

from parley.engine.speculative import verify

DRAWS = 20_000
X = 2  # the guessed token


def binomial_p_value(k: int, n: int, rate: float) -> float:
    """Two-sided exact p-value: the mass of every count no likelier than k under binomial(n, rate)."""
    if rate >= 1.0:
        return 1.0 if k == n else 0.0

    def log_pmf(i: int) -> float:
        return (math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                + i * math.log(rate) + (n - i) * math.log1p(-rate))

    observed = log_pmf(k)
    return min(1.0, sum(math.exp(lp) for lp in map(log_pmf, range(n + 1)) if lp <= observed + 1e-9))


def rows(ratio: float, drafted: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """p [2, V] (the guessed position, then the bonus position) and q [1, V] or None, with p(x)/q(x) = ratio."""
    q = torch.tensor([0.05, 0.15, 0.6, 0.1, 0.1]) if drafted else None
    qx = float(q[X]) if q is not None else 1.0
    p0 = torch.full((5,), 0.0)
    p0[X] = ratio * qx
    rest = 1.0 - float(p0[X])
    others = [i for i in range(5) if i != X]
    for i in others:  # the remainder spread so that p - q > 0 off x wherever possible
        p0[i] = rest / len(others)
    p = torch.stack([p0, torch.full((5,), 0.2)])
    return p, (q[None] if q is not None else None)


@pytest.mark.parametrize("drafted", [False, True], ids=["prompt-lookup", "draft-model"])
@pytest.mark.parametrize("ratio", [0.5, 0.99, 0.995])
def test_acceptance_rate_is_p_over_q(ratio: float, drafted: bool) -> None:
    seed = int(ratio * 1000) + 7 * drafted
    generator = torch.Generator().manual_seed(seed)
    p, q = rows(ratio, drafted)
    accepted = 0
    for _ in range(DRAWS):
        out = verify(p, [X], q, generator)
        if len(out) == 2:
            assert out[0] == X
            accepted += 1
        else:
            assert len(out) == 1 and out[0] != X, f"seed={seed}: a rejected guess was emitted anyway: {out}"
    rate = float(p[0, X]) / (float(q[0, X]) if q is not None else 1.0)
    pv = binomial_p_value(accepted, DRAWS, rate)
    assert pv > 1e-4, (f"seed={seed} p/q={ratio}: {accepted} of {DRAWS} guesses accepted, expected "
                       f"{DRAWS * rate:.0f} ({DRAWS - accepted} rejected vs {DRAWS * (1 - rate):.0f}); "
                       f"p-value {pv:.2g}")
