"""The 4-bit output head rounded by GPTQ against the model's own final hidden states: its logits on held-out
tokens are closer to the fp head's than the round-to-nearest head's (hidden states with salient channels, as
real models have); it stays opt-in (PARLEY_HEAD_BITS=4), its calibration text is read once, and a cached
start asks for none."""

from __future__ import annotations

import pytest
import torch
from awq_tiny import outlier_model, write_hf_dir

from parley.engine.engine import Engine
from parley.models import native_forward
from parley.models.native_step import NativeStep
from parley.models.quantize import head4
from parley.models.quantize.int4_linear import Int4Linear, decoder_linears

pytestmark = pytest.mark.skipif(native_forward.library() is None,
                                reason=f"native step unavailable: {native_forward.why_unavailable()}")

SEED = 3


def int4_model(vocab: int):
    model = outlier_model(seed=SEED, vocab=vocab)
    with torch.no_grad():
        model.norm.weight.copy_(1 + 0.1 * torch.randn(model.config.dim))
        model.norm.weight[torch.randperm(model.config.dim)[:6]] *= 15  # salient channels into the head
    for parent, name, lin in decoder_linears(model):
        setattr(parent, name, Int4Linear.from_linear(lin, 64))
    return model


def logits(step, ids: torch.Tensor, model) -> torch.Tensor:
    return step(ids[None], torch.arange(ids.numel())[None], model.new_cache(ids.numel()))[0]


def test_gptq_head_is_closer_to_the_fp_head_than_round_to_nearest():
    model = int4_model(vocab=2048)
    gen = torch.Generator().manual_seed(SEED)
    calib = torch.randint(0, 2048, (8, 64), generator=gen)
    held_out = torch.randint(0, 2048, (96,), generator=gen)
    with torch.inference_mode():
        ref = logits(model, held_out, model)  # the fp head on the INT4 layers
        rtn = logits(NativeStep.for_model(model, head_bits=4), held_out, model)
        gptq = logits(NativeStep.for_model(model, head_bits=4,
                                           head_gram=lambda: head4.final_hidden_gram(model, calib)), held_out, model)
    err_rtn, err_gptq = (rtn - ref).norm().item(), (gptq - ref).norm().item()
    assert err_gptq < 0.9 * err_rtn, f"seed {SEED}: GPTQ {err_gptq:.4f} vs round-to-nearest {err_rtn:.4f}"


def test_the_opt_in_4_bit_head_is_rounded_by_gptq_once_then_cached(tmp_path, monkeypatch):
    source = str(write_hf_dir(outlier_model(seed=SEED, vocab=4096), tmp_path / "big-vocab"))
    asked = []
    real = head4.head_calibration
    monkeypatch.setattr(head4, "head_calibration", lambda tok: asked.append(1) or real(tok))
    monkeypatch.delenv("PARLEY_HEAD_BITS", raising=False)
    assert Engine.load(source, quant="awq", device="cpu").native.head_bits == 8 and asked == []  # the default
    monkeypatch.setenv("PARLEY_HEAD_BITS", "4")
    first = Engine.load(source, quant="awq", device="cpu")
    assert first.native.head_bits == 4 and asked == [1]
    first.reset_cache()
    want = first.forward(list(range(5, 40)))
    second = Engine.load(source, quant="awq", device="cpu")  # the head comes from the cache: no calibration
    second.reset_cache()
    assert second.native.head_bits == 4 and asked == [1] and torch.equal(second.forward(list(range(5, 40))), want)
