"""Our Transformer equals transformers' Gemma 3 on a tiny random model loaded from a safetensors folder:
sliding-window and global layers with their own rope bases, sandwich norms stored as w for a gain of 1 + w,
GeGLU, scaled embeddings, q/k norms, query_pre_attn_scalar; positions run well past the window."""

import pytest
import torch
from tiny_models import write_model_dir

from parley.models.loading import load_model
from parley.models.resolve import resolve

transformers = pytest.importorskip("transformers")

SEED = 0
WINDOW = 8
CONFIG = dict(model_type="gemma3_text", vocab_size=259, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=1, head_dim=32, max_position_embeddings=128,
              rms_norm_eps=1e-6, sliding_window=WINDOW, query_pre_attn_scalar=24, tie_word_embeddings=True,
              layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                               "full_attention": {"rope_type": "default", "rope_theta": 1000.0}})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.manual_seed(SEED)
    hf_cfg = transformers.Gemma3TextConfig(**{k: v for k, v in CONFIG.items() if k != "model_type"})
    ref = transformers.Gemma3ForCausalLM(hf_cfg).eval()
    with torch.no_grad():  # Gemma initialises its norms to 0 (gain 1): random ones catch a missing 1 + w
        for name, p in ref.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(0, 0.3)
    ref.config._attn_implementation = "eager"
    path = write_model_dir(tmp_path_factory.mktemp("gemma3"), ref, {"tie_word_embeddings": True})
    return ref, load_model(resolve(str(path)))


@torch.no_grad()
def test_prefill_then_decode_past_the_window_matches(models):
    ref, ours = models
    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, 259, (1, 5 * WINDOW), generator=gen)
    want = ref(ids).logits
    cache = ours.new_cache(64)
    got = [ours(ids[:, :WINDOW + 3], torch.arange(WINDOW + 3)[None], cache)]
    for t in range(WINDOW + 3, ids.shape[1]):
        got.append(ours(ids[:, t : t + 1], torch.tensor([[t]]), cache))
    torch.testing.assert_close(torch.cat(got, 1), want, atol=1e-4, rtol=1e-4, msg=f"seed {SEED}")
