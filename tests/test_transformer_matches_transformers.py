"""Our Transformer's logits equal transformers' reference implementation on tiny random models."""

import pytest
import torch

from parley.models.config import ModelConfig
from parley.models.transformer import Transformer

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=257, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            rms_norm_eps=1e-5, rope_theta=10000.0)

CONFIGS = {
    "llama": dict(model_type="llama", tie_word_embeddings=False),
    "llama3-rope-tied": dict(model_type="llama", tie_word_embeddings=True,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "mistral": dict(model_type="mistral", tie_word_embeddings=False, sliding_window=None),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True),
    "qwen3": dict(model_type="qwen3", tie_word_embeddings=False, head_dim=32),
}


def reference_and_ours(name: str):
    torch.manual_seed(0)
    cfg = {**BASE, **CONFIGS[name]}
    hf_cfg = transformers.AutoConfig.for_model(**cfg)
    ref = transformers.AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="eager").eval()
    with torch.no_grad():  # random biases too, so qwen2's qkv bias is exercised
        for n, p in ref.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.5)
    ours = Transformer(ModelConfig.from_hf(hf_cfg.to_dict())).eval()
    state = {k.removeprefix("model."): v for k, v in ref.state_dict().items()}
    missing, unexpected = ours.load_state_dict(state, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)
    return ref, ours


@pytest.mark.parametrize("name", list(CONFIGS))
@torch.no_grad()
def test_prefill_decode_and_truncation_match(name):
    ref, ours = reference_and_ours(name)
    ids = torch.randint(0, 257, (1, 40))
    want = ref(ids).logits

    cache = ours.new_cache(64)
    # prefill 24, then decode one at a time
    got = [ours(ids[:, :24], torch.arange(24)[None], cache)]
    for t in range(24, 40):
        got.append(ours(ids[:, t : t + 1], torch.tensor([[t]]), cache))
    torch.testing.assert_close(torch.cat(got, 1), want, atol=1e-4, rtol=1e-4)

    # roll back to 30 and decode a different continuation; compare with a fresh reference run
    cache.truncate(30)
    alt = torch.cat([ids[:, :30], torch.randint(0, 257, (1, 6))], 1)
    want_alt = ref(alt).logits[:, 30:]
    got_alt = ours(alt[:, 30:33], torch.arange(30, 33)[None], cache)
    got_alt2 = torch.cat([ours(alt[:, t : t + 1], torch.tensor([[t]]), cache) for t in range(33, 36)], 1)
    torch.testing.assert_close(torch.cat([got_alt, got_alt2], 1), want_alt, atol=1e-4, rtol=1e-4)
