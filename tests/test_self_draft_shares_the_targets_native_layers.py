"""`--draft self:N` on the CPU runs a view of the target's native step (its first N layers, final norm and head):
nothing is packed or held twice, and its logits are bitwise those of a step packed from the same N layers."""

from __future__ import annotations

import pytest
import torch
from awq_tiny import outlier_model, write_hf_dir

from parley.engine.engine import Engine
from parley.models import native_forward
from parley.models.native_step import NativeStep

pytestmark = pytest.mark.skipif(native_forward.library() is None,
                                reason=f"native step unavailable: {native_forward.why_unavailable()}")
SEED = 0


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(write_hf_dir(outlier_model(seed=3, layers=3), tmp_path_factory.mktemp("tiny") / "model"))


@pytest.mark.parametrize(("quant", "layers"), [("awq", 1), ("awq", 2), ("none", 2)])
@torch.no_grad()
def test_the_self_draft_is_a_view_with_the_same_logits(folder, quant, layers):
    engine = Engine.load(folder, quant=quant, draft=f"self:{layers}", device="cpu")
    view = engine.draft.native
    assert view is not None and view.whole is engine.native and not view.packed  # nothing packed of its own
    shell = engine.draft.model
    packed = NativeStep.for_model(shell, head_bits=engine.native.head_bits)  # the same N layers packed afresh
    g = torch.Generator().manual_seed(SEED)
    tokens = torch.randint(0, shell.config.vocab_size, (1, 11), generator=g)
    pos = torch.arange(11)[None]
    got = view(tokens, pos, shell.new_cache(64))
    want = packed(tokens, pos, shell.new_cache(64))
    assert torch.equal(got, want), f"seed {SEED}"
    whole = engine.native(tokens, pos, engine.model.new_cache(64))
    assert not torch.equal(got, whole)  # and not the whole model's
    assert view.weight_bytes < engine.native.weight_bytes
