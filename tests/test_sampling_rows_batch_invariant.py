"""A row of `probs` is bit for bit the same inside a 17-row verification batch as computed alone, as
plain decoding computes it, on a real vocabulary size and with several threads (a [T, V] reduction
splits its rows across threads differently from a [1, V] one: the final normalisation once did)."""

import pytest
import torch

from parley.engine.params import GenerationParams
from parley.engine.sampling import probs

CASES = [GenerationParams(temperature=0.7, top_p=0.9, top_k=200, min_p=0.01, repeat_penalty=1.3),
         GenerationParams(temperature=1.0, top_p=1.0),
         GenerationParams(temperature=0.7, top_p=0.95, frequency_penalty=0.5, presence_penalty=0.2)]


@pytest.fixture(params=[1, 4])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("params", CASES, ids=["all-transforms", "plain-softmax", "openai-penalties"])
def test_a_row_is_the_same_alone_and_in_a_batch(threads, params):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(17, 49152, generator=g) * 3).bfloat16().float()  # ties, as on the INT4 engine
    history = torch.randint(0, 49152, (100,), generator=g).tolist()
    drafted = torch.randint(0, 49152, (16,), generator=g).tolist()
    batch = probs(logits, params, history=history, drafted=drafted)
    for i in range(17):
        alone = probs(logits[i], params, history=history + drafted[:i])
        assert torch.equal(batch[i], alone), f"row {i}, {threads} threads"
