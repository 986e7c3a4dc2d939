"""A model written as llama.cpp's converter writes it (renamed tensors, llama q/k rows permuted for its
rotary) loads back to the logits of the original, for each family and with tied or untied embeddings."""

import pytest
import torch
from tiny_models import reference_model, tiny_config, write_gguf

from parley.models.loading import load_config, load_model
from parley.models.resolve import resolve

pytest.importorskip("transformers")

CASES = {
    "llama-gqa": tiny_config("llama", tied=False),
    "llama-tied": tiny_config("llama", tied=True),
    "qwen2-bias": tiny_config("qwen2", tied=True),
    "qwen3-qknorm": {**tiny_config("qwen3", tied=False), "head_dim": 32},
}


@pytest.mark.parametrize("name", list(CASES))
@torch.no_grad()
def test_gguf_loads_to_the_source_logits(name, tmp_path):
    cfg = CASES[name]
    ref = reference_model(cfg)
    if cfg["model_type"] == "qwen2":  # random qkv biases, so the bias mapping is exercised
        for n, p in ref.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.5)
    files = resolve(str(write_gguf(tmp_path / "tiny.gguf", ref, cfg)))
    config = load_config(files)
    assert (config.arch, config.tie_embeddings, config.head_dim) == (
        cfg["model_type"], cfg["tie_word_embeddings"], cfg.get("head_dim", 16))
    model = load_model(files)
    ids = torch.randint(0, 259, (1, 20))
    got = model(ids, torch.arange(20)[None], model.new_cache(32))
    torch.testing.assert_close(got, ref(ids).logits, atol=1e-5, rtol=1e-5)
