"""Speculative decoding: drafters guess k tokens cheaply; the target checks them all in one pass.

`verify` is the exact rejection-sampling rule of Leviathan et al. / Chen et al. (2023): the emitted
tokens are distributed exactly as if the target had sampled them one at a time from `sampling.probs`.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from .params import GenerationParams
from .sampling import sample


class Drafter(Protocol):
    def propose(self, context: list[int], k: int, params: GenerationParams) -> tuple[list[int], Tensor | None]:
        """Up to k guessed next tokens for `context`, and the distributions [n, V] they were drawn from
        (None for a deterministic drafter: q is then one-hot on each guess)."""
        ...


def verify(p: Tensor, draft: list[int], q: Tensor | None, generator: torch.Generator) -> list[int]:
    """Tokens to emit: the accepted prefix of `draft`, then one token sampled by the target.

    p: target distributions [len(draft) + 1, V] at each draft position and one past the last.
    Accept x with probability min(1, p(x)/q(x)); on the first rejection sample from
    normalize(max(0, p - q)); if all are accepted, sample a bonus token from the last row of p.
    """
    p = p.cpu()
    q = q.cpu() if q is not None else None
    out: list[int] = []
    for i, x in enumerate(draft):
        px = float(p[i, x])
        qx = float(q[i, x]) if q is not None else 1.0
        if qx > 0 and float(torch.rand((), generator=generator)) * qx < px:
            out.append(x)
            continue
        if q is not None:
            residual = (p[i] - q[i]).clamp_min(0.0)
        else:
            residual = p[i].clone()
            residual[x] = 0.0  # p - one_hot(x), clamped
        total = float(residual.sum())
        # p == q leaves nothing to reject into; then p itself is the right distribution.
        out.append(sample(residual / total if total > 0 else p[i], generator))
        return out
    out.append(sample(p[len(draft)], generator))
    return out


class PromptLookup:
    """Guesses from the context itself: find the newest n-gram earlier in the context (longest n
    first) and propose the tokens that followed it. Costs no model pass; proposes nothing when
    nothing matches, so free chat pays nothing."""

    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        self.min_n, self.max_n = min_n, max_n

    def propose(self, context: list[int], k: int, params: GenerationParams) -> tuple[list[int], Tensor | None]:
        n_ctx = len(context)
        for n in range(min(self.max_n, n_ctx - 1), self.min_n - 1, -1):
            tail = context[-n:]
            # newest earlier occurrence first: it is the likeliest to continue the same way
            for start in range(n_ctx - n - 1, -1, -1):
                if context[start : start + n] == tail:
                    follow = context[start + n : start + n + k]
                    if follow:
                        return follow, None
        return [], None


class AdaptiveDraftLength:
    """k grows after a fully accepted round and shrinks after a rejection, within [1, k_max]."""

    def __init__(self, k_max: int, k: int | None = None) -> None:
        self.k_max = k_max
        self.k = min(k or 4, k_max)

    def update(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        if accepted == proposed:
            self.k = min(self.k + 2, self.k_max)
        else:
            self.k = max(1, min(self.k - 1, accepted + 1))
