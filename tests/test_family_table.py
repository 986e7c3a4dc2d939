"""One table says what each family is called and what it switches on (models/families.py): a config.json of any
of a family's model types comes out with the family's switches, and `to_hf` writes a config that reads back as
the same model."""

from __future__ import annotations

import pytest

from parley.models import families
from parley.models.config import SUPPORTED_ARCHITECTURES, ConfigError, ModelConfig

SIZES = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
RUNS = [f for f in families.FAMILIES if f.runs]


def test_the_supported_architectures_are_the_families_that_run():
    assert SUPPORTED_ARCHITECTURES == ("llama", "mistral", "qwen2", "qwen3", "gemma3")
    assert all(f.hf_class and f.model_types and f.gguf_archs for f in RUNS)


@pytest.mark.parametrize("family", RUNS, ids=lambda f: f.name)
def test_every_model_type_reads_as_its_family_with_its_switches(family):
    for model_type in family.model_types:
        config = ModelConfig.from_hf({**SIZES, "model_type": model_type})
        assert config.arch == family.name and config.family is family
        assert (config.qkv_bias, config.qk_norm) == (family.qkv_bias, family.qk_norm)
        assert {k: getattr(config, k) for k in family.block_switches()} == family.block_switches()
        assert config.local_rope == family.sliding_window
        assert config.tie_embeddings == family.tie_embeddings


@pytest.mark.parametrize("family", RUNS, ids=lambda f: f.name)
def test_to_hf_reads_back_as_the_same_model(family):
    config = ModelConfig.from_hf({**SIZES, "model_type": family.model_types[0], "attention_bias": True})
    written = config.to_hf()
    assert written["architectures"] == [family.hf_class] and written["model_type"] == family.model_types[0]
    assert ModelConfig.from_hf(written) == config


def test_gemma3_layers_slide_five_to_one_with_their_own_rope_base():
    config = ModelConfig.from_hf({**SIZES, "model_type": "gemma3_text", "sliding_window": 32})
    assert config.layer_windows == (32, 32, 32, 32, 32, 0)
    assert config.rope_local_theta == 10000.0 and config.rope_theta == 1000000.0
    assert config.query_scale == 256 ** -0.5


def test_a_family_known_for_its_files_only_is_not_run():
    with pytest.raises(ConfigError, match="not supported"):
        ModelConfig.from_hf({**SIZES, "model_type": "gemma2"})
    assert families.by_gguf_arch("gemma2").chat_template == families.GEMMA_TEMPLATE


def test_lookups():
    assert families.by_model_type("gemma3_text") is families.family("gemma3")
    assert families.by_model_type("phi3") is None and families.by_gguf_arch(None) is None
    with pytest.raises(ValueError, match="phi3"):
        families.family("phi3")
