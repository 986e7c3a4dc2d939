"""The draft model draws each guess from exactly the q row it reports (after temperature and top-p),
with the reply's generator wherever the model lives. Verification divides by that q: a guess drawn
from anything else (e.g. the untruncated softmax) breaks the output law (issue 10, mutant 1)."""

from collections import Counter

import pytest
import torch
from single_thread import single_thread  # noqa: F401
from spec_helpers import chi_square_p_value
from tiny import ByteTokenizer, tiny_model

from parley.engine.params import GenerationParams
from parley.engine.sampling import make_generator
from parley.engine.speculative import DraftModel

PARAMS = GenerationParams(temperature=1.5, top_p=0.5)  # hot and truncated: q differs from the softmax
CONTEXT = list(b"hello world")
DRAWS = 2000


def test_guesses_lie_in_the_support_of_q_and_follow_it():
    draft = DraftModel(tiny_model(seed=4), ByteTokenizer(), ByteTokenizer(), min_confidence=0.0)
    g = torch.Generator().manual_seed(0)
    firsts = Counter()
    q0 = None
    for _ in range(DRAWS):
        guess, q = (p := draft.propose(CONTEXT, 3, PARAMS, g)).tokens, p.q
        assert all(float(q[i, x]) > 0 for i, x in enumerate(guess)), (guess, q.gather(1, torch.tensor(guess)[:, None]))
        firsts[guess[0]] += 1
        q0 = q[0] if q0 is None else q0
        assert torch.equal(q[0], q0)  # the first row depends on the context only
    assert (q0 > 0).sum() > 1  # a real choice, not a one-hot
    law = {x: float(p) for x, p in enumerate(q0) if p > 0}
    assert chi_square_p_value(firsts, law, DRAWS) > 1e-3


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", devices())
def test_draft_sampling_uses_the_replys_generator_on_any_device(device):
    """The reply's generator is a CPU generator (`sampling.make_generator`); a draft model on another
    device must still sample with it: same seed, same guesses; another seed, other guesses."""
    model = tiny_model(seed=4).to(device)
    draft = DraftModel(model, ByteTokenizer(), ByteTokenizer(), min_confidence=0.0)
    runs = [draft.propose(CONTEXT, 6, PARAMS, make_generator(seed)).tokens for seed in (1, 1, 2, 3, 4)]
    assert runs[0] == runs[1]
    assert any(r != runs[0] for r in runs[2:])
