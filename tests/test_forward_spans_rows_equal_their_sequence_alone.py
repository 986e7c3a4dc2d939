"""`Transformer.forward_spans` (the PyTorch path's shared pass): every family's switches (llama; qwen2's qkv bias;
qwen3's q/k norms; Gemma 3's sliding-window layers with their own rope base and sandwich norms), three sequences
at different depths, some rows past Gemma's window. Each span's logits are bitwise those of its own 16-row pass,
and equal (to fp32 rounding) to the model's plain forward over the same cache: the spans' masks, positions and
caches are each sequence's own."""

from __future__ import annotations

import pytest
import torch
from native_models import small_model

from parley.models.config import ModelConfig
from parley.models.transformer import Span, Transformer

GEMMA3 = dict(model_type="gemma3_text", vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=1, head_dim=32, max_position_embeddings=128,
              rms_norm_eps=1e-6, sliding_window=8, query_pre_attn_scalar=24, tie_word_embeddings=True,
              layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                               "full_attention": {"rope_type": "default", "rope_theta": 1000.0}})


def model_of(arch: str, seed: int) -> Transformer:
    if arch != "gemma3":
        return small_model(False, seed=seed, arch=arch, norms=True)
    torch.manual_seed(seed)
    model = Transformer(ModelConfig.from_hf(GEMMA3)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 0.3 if "norm" in name else 0.08)
    return model


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_each_span_gets_its_pass_alone(arch: str) -> None:
    seed = ["llama", "qwen2", "qwen3", "gemma3"].index(arch)
    model = model_of(arch, seed)
    g = torch.Generator().manual_seed(seed)
    window = 64
    caches, spans, tokens, at = [], [], [], 0
    with torch.inference_mode():
        for depth, rows in ((10, 1), (23, 6), (7, 9)):
            cache = model.new_cache(window)
            prompt = torch.randint(0, 300, (1, depth), generator=g)
            model(prompt, torch.arange(depth)[None], cache, True, window)
            caches.append(cache)
            spans.append(Span(slice(at, at + rows), torch.arange(depth, depth + rows), cache))
            tokens.append(torch.randint(0, 300, (rows,), generator=g))
            at += rows
        together = model.forward_spans(torch.cat(tokens), spans, 16)
        for i, (span, toks) in enumerate(zip(spans, tokens, strict=True)):
            alone = model.forward_spans(toks, [span._replace(rows=slice(0, len(toks)))], 16)
            assert torch.equal(together[span.rows], alone), f"{arch}, seed {seed}: span {i}"
            plain = model(toks[None], span.positions[None], span.cache, False, window)[0]
            torch.testing.assert_close(alone, plain, rtol=1e-4, atol=1e-4, msg=f"{arch}, seed {seed}: span {i}")
