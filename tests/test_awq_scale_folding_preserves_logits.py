"""Folding the searched AWQ scales into the preceding norm / linear leaves the fp model's logits unchanged
(before any rounding): the scales move quantization error around, never the function."""

import pytest
import torch
from awq_tiny import embedded_model, logits, outlier_model

from parley.models.quantize.awq import AWQSettings, awq_quantize
from parley.models.quantize.calibration import load_calibration


@pytest.mark.parametrize("kind", ["gqa", "mha", "qkv-bias"])
@torch.no_grad()
def test_tiny_model_logits_unchanged(kind):
    model = {"gqa": lambda: outlier_model(),
             "mha": lambda: outlier_model(n_kv_heads=4),  # v feeds o channel for channel: o is scaled too
             "qkv-bias": lambda: outlier_model(qkv_bias=True)}[kind]()
    tokens = torch.randint(0, 256, (6, 48), generator=torch.Generator().manual_seed(1))
    before = logits(model, tokens)
    norms = [b.input_layernorm.weight.clone() for b in model.layers]
    report = awq_quantize(model, tokens, AWQSettings(group_size=32), quantize=False)
    after = logits(model, tokens)

    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)
    # the search really did scale (otherwise the check above proves nothing)
    assert any(a > 0 for layer in report.layers for a in layer.alphas.values())
    assert any(not torch.equal(n, b.input_layernorm.weight) for n, b in zip(norms, model.layers, strict=True))
    if kind == "mha":
        assert "o" in report.layers[0].alphas


@pytest.mark.slow
@torch.no_grad()
def test_embedded_model_logits_unchanged():
    """The real model's first 2 layers (norm, q/k/v, gate/up, down folding on real activations)."""
    model, tok = embedded_model(2)
    calib = load_calibration(tok.encode, 4, 64, "builtin").tokens
    before = logits(model, calib)
    awq_quantize(model, calib, AWQSettings(group_size=64), quantize=False)
    torch.testing.assert_close(logits(model, calib), before, atol=1e-4, rtol=1e-4)
