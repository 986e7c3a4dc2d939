"""The top-p nucleus on real vocabulary sizes: exact against a float64 full-sort reference whether the
nucleus fits in the sorted head or needs the whole row, tied tokens kept or dropped together, and the
same nucleus for a row alone as inside a 17-row verification batch.
"""

import torch

from parley.engine.sampling import nucleus

V = 20_000


def reference(p: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep a token when the tokens strictly more probable than it sum to less than top_p (float64)."""
    s = torch.sort(p.double()).values  # ascending
    mass_from = torch.flip(torch.cumsum(torch.flip(s, [0]), 0), [0])  # mass_from[j] = s[j:].sum()
    first_above = torch.searchsorted(s, p.double(), right=True)
    above = torch.cat([mass_from, torch.zeros(1, dtype=torch.float64)])[first_above]
    return torch.where(above < top_p, p, 0.0)


def test_nucleus_matches_float64_reference_from_peaked_to_flat_rows():
    # Scale 8: a few tokens cover top_p (the 64-token head suffices); scale 0.3: thousands do.
    for seed in range(24):
        g = torch.Generator().manual_seed(seed)
        scale = [8.0, 3.0, 1.0, 0.3][seed % 4]
        top_p = float(torch.rand((), generator=g)) * 0.9 + 0.05
        p = torch.softmax(torch.randn(4, V, generator=g) * scale, -1)
        got = nucleus(p, top_p)
        for i in range(len(p)):
            want = reference(p[i], top_p)
            assert torch.equal(got[i], want), (f"seed {seed}, row {i}, top_p {top_p}: kept {int((got[i] > 0).sum())} "
                                               f"tokens, reference {int((want > 0).sum())}")


def test_tied_tokens_stay_or_go_together():
    # .5 then two tokens of .25 (exact in binary). The mass above each tie is .5: with top_p .75 both
    # stay (a rule following sort order would keep one, .5 + .25 already covering .75); with top_p .5
    # the .5 alone covers it and both go.
    p = torch.tensor([[0.25, 0.5, 0.25, 0.0]])
    assert nucleus(p, 0.75).tolist() == p.tolist()
    assert nucleus(p, 0.5).tolist() == [[0.0, 0.5, 0.0, 0.0]]


def test_a_row_keeps_its_nucleus_inside_a_verification_batch():
    # bf16-resolution logits make exact ties common, as on the INT4 engine.
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(17, V, generator=g) * 2).bfloat16().float()
    p = torch.softmax(logits, -1)
    batch = nucleus(p, 0.9)
    for i in range(len(p)):
        assert torch.equal(nucleus(p[i : i + 1], 0.9), batch[i : i + 1]), f"row {i}"
