"""The distribution a token is drawn from. Plain sampling and speculative verification both use
`probs`, so the verifier compares the draft against exactly what plain decoding would sample from."""

from __future__ import annotations

import torch
from torch import Tensor

from .params import GenerationParams


def probs(logits: Tensor, params: GenerationParams, history: list[int] | None = None,
          drafted: list[int] | None = None) -> Tensor:
    """logits [..., V] -> fp32 probabilities after temperature, top-k, top-p and min-p.

    Temperature 0 returns the one-hot of the argmax: greedy decoding is then the same code path as
    sampling, and verification against a one-hot p accepts a draft exactly when it is the argmax.
    """
    logits = logits.float()
    if params.temperature == 0:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    p = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(p, dim=-1, descending=True)
        # Drop a token when the tokens ranked above it already cover top_p; the first always stays.
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= params.top_p
        p = p.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), 0.0)
    if params.min_p > 0.0:
        p = p.masked_fill(p < params.min_p * p.amax(-1, keepdim=True), 0.0)
    return p / p.sum(-1, keepdim=True)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A private RNG: a fixed seed gives the same reply whatever else the process draws."""
    g = torch.Generator(device=device)
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g


def sample(p: Tensor, generator: torch.Generator) -> int:
    """Draw one token id from a distribution [V]."""
    return int(torch.multinomial(p, 1, generator=generator).item())
