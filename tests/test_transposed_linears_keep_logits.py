"""The CPU layout swap (weights stored [in, out]) leaves the model's logits unchanged."""

import torch
from tiny import tiny_model

from parley.models.transposed_linear import TransposedLinear, transpose_linears


@torch.no_grad()
def test_logits_unchanged_and_every_linear_swapped():
    model = tiny_model()
    ids = torch.randint(0, 259, (1, 12))
    want = model(ids, torch.arange(12)[None], model.new_cache(32))
    transpose_linears(model)
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert isinstance(model.lm_head, TransposedLinear)
    got = model(ids, torch.arange(12)[None], model.new_cache(32))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
