"""Rotating the residual stream (norms folded, Hadamard-like Q folded into embeddings, every linear and the
head) leaves the fp model's logits unchanged and writes an ordinary untied llama-shaped model; Gemma-like
architectures are left alone."""

import pytest
import torch
from awq_tiny import logits, outlier_model

from parley.models.quantize.rotate import hadamard, random_rotation, rotatable, rotate_model


@pytest.mark.parametrize("n", [1, 2, 12, 64, 576, 960, 1536])
def test_hadamard_orders(n):
    h = hadamard(n)
    assert h is not None and h.abs().eq(1).all(), n
    torch.testing.assert_close(h @ h.t(), n * torch.eye(n, dtype=torch.float64), atol=0, rtol=0)


def test_rotation_without_hadamard_is_still_orthogonal():
    assert hadamard(18) is None  # no Hadamard matrix of an order that is not a multiple of 4
    q = random_rotation(18, seed=3)
    torch.testing.assert_close(q @ q.t(), torch.eye(18, dtype=torch.float64), atol=1e-12, rtol=0)


@pytest.mark.parametrize("kind", ["tied", "untied", "qkv-bias"])
@torch.no_grad()
def test_logits_unchanged(kind):
    seed = 7
    model = outlier_model(seed=seed, qkv_bias=kind == "qkv-bias")
    if kind == "tied":
        model.config.tie_embeddings = True
        model.lm_head.weight = model.embed_tokens.weight
    with torch.no_grad():
        model.norm.weight.copy_(1 + 0.3 * torch.randn(model.config.dim, generator=torch.Generator().manual_seed(seed)))
    tokens = torch.randint(0, 256, (3, 40), generator=torch.Generator().manual_seed(seed))
    before = logits(model, tokens)
    embed_before = model.embed_tokens.weight.clone()
    rotate_model(model, seed=seed)
    torch.testing.assert_close(logits(model, tokens), before, atol=2e-4, rtol=1e-4, msg=f"seed {seed}")
    # an ordinary untied checkpoint: unit norms, a head of its own, the stream really rotated
    assert not model.config.tie_embeddings
    assert model.lm_head.weight.data_ptr() != model.embed_tokens.weight.data_ptr()
    for norm in [model.norm, *(n for b in model.layers for n in (b.input_layernorm, b.post_attention_layernorm))]:
        assert torch.equal(norm.weight, torch.ones_like(norm.weight))
    assert (model.embed_tokens.weight - embed_before).abs().max() > 0.1


def test_outliers_are_spread():
    """The salient input channels (x20 norm weights) make a few columns of q_proj huge; rotated, the
    largest column norm is close to the mean one."""
    model = outlier_model(seed=1)
    def spread(m):
        cols = m.layers[0].self_attn.q_proj.weight.norm(dim=0)
        return (cols.max() / cols.mean()).item()
    from parley.models.quantize.rotate import fold_norms
    fold_norms(model)
    folded = spread(model)
    rotate_model(model, seed=1)  # folding again is a no-op on unit norms
    assert folded > 4 and spread(model) < 1.5, (folded, spread(model))


def test_gemma_is_not_rotated():
    model = outlier_model()
    model.config.arch = "gemma3"
    assert not rotatable(model)
    with pytest.raises(ValueError, match="gemma3"):
        rotate_model(model)
