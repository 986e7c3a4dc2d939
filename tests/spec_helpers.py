"""Helpers for the speculative-decoding tests."""

import copy

import torch


def perturbed(model, scale: float = 0.3, seed: int = 1):
    """A draft close to the target but not equal (noise on the output projection): its guesses are
    accepted often and rejected often, so both branches of verification run."""
    draft = copy.deepcopy(model)
    torch.manual_seed(seed)
    with torch.no_grad():
        draft.lm_head.weight[:256] += scale * torch.randn_like(draft.lm_head.weight[:256])
    return draft
