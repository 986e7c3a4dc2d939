"""Helpers for the speculative-decoding tests."""

import copy
from collections import Counter

import torch


def perturbed(model, scale: float = 0.3, seed: int = 1):
    """A draft close to the target but not equal (noise on the output projection): its guesses are
    accepted often and rejected often, so both branches of verification run."""
    draft = copy.deepcopy(model)
    torch.manual_seed(seed)
    with torch.no_grad():
        draft.lm_head.weight[:256] += scale * torch.randn_like(draft.lm_head.weight[:256])
    return draft


def chi_square_p_value(counts: Counter, law: dict, n: int, outside_allowed: bool = False) -> float:
    """Pearson's chi-square p-value of `counts` (n draws) against `law` {cell: probability}: cells with
    expected count >= 5 kept, the rest pooled into one cell (draws outside the law fall there when
    `outside_allowed`, otherwise they fail the test outright)."""
    outside = set(counts) - {c for c, v in law.items() if v > 0}
    assert outside_allowed or not outside, f"draws the law cannot produce: {sorted(outside)[:10]}"
    big = [c for c in law if law[c] * n >= 5]
    observed = [counts[c] for c in big] + [n - sum(counts[c] for c in big)]
    expected = [law[c] * n for c in big] + [n - sum(law[c] * n for c in big)]
    if expected[-1] < 5:  # too little left over to pool: fold it into the largest cell
        i = max(range(len(big)), key=lambda j: expected[j])
        observed[i] += observed.pop()
        expected[i] += expected.pop()
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    df = torch.tensor(len(observed) - 1, dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, torch.tensor(stat, dtype=torch.float64) / 2))
