"""A local safetensors directory (one file or shards, tied or untied embeddings) loads to transformers' logits."""

import pytest
import torch
from tiny_models import reference_model, tiny_config, write_model_dir

from parley.models.loading import load_config, load_model
from parley.models.resolve import resolve

pytest.importorskip("transformers")


@pytest.mark.parametrize(("family", "tied", "shards"), [("llama", False, 1), ("llama", True, 1), ("qwen2", True, 2),
                                                        ("qwen3", False, 3)])
@torch.no_grad()
def test_loads_to_the_source_logits(tmp_path, family, tied, shards):
    cfg = tiny_config(family, tied=tied)
    ref = reference_model(cfg)
    files = resolve(str(write_model_dir(tmp_path / "m", ref, cfg, shards=shards)))
    assert files.kind == "dir" and load_config(files).tie_embeddings == tied
    model = load_model(files)
    assert (model.lm_head.weight is model.embed_tokens.weight) == tied
    ids = torch.randint(0, 259, (1, 12))
    got = model(ids, torch.arange(12)[None], model.new_cache(16))
    torch.testing.assert_close(got, ref(ids).logits, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_dtype_and_rope_buffer(tmp_path):
    cfg = tiny_config("llama")
    files = resolve(str(write_model_dir(tmp_path / "m", reference_model(cfg), cfg)))
    model = load_model(files, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.inv_freq.dtype == torch.float32 and model.inv_freq.device.type == "cpu"
    assert not any(p.is_meta for p in model.parameters())
