"""An AWQ folder made from a GGUF with llama3-style RoPE scaling (`rope_freqs` divisors) reloads through
the one assembler with the GGUF's rotary frequencies, hence the same logits; without them it would not."""

import torch
from awq_tiny import logits
from tiny_models import reference_model, tiny_config, tokenizer_json, write_gguf

from parley.models.config import ModelConfig
from parley.models.loading import load_model
from parley.models.quantize.awq import AWQSettings, awq_quantize
from parley.models.quantize.cache import ensure_quantized
from parley.models.quantize.checkpoint import save_awq
from parley.models.resolve import resolve
from parley.models.transformer import rope_frequencies

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}


def llama3_gguf(tmp_path):
    """A tiny llama GGUF whose rope_freqs are what convert_hf_to_gguf computes for LLAMA3 scaling."""
    cfg = tiny_config("llama")
    plain = ModelConfig.from_hf(cfg)
    scaled = ModelConfig.from_hf({**cfg, "rope_scaling": LLAMA3})
    divisors = rope_frequencies(plain) / rope_frequencies(scaled)
    assert not torch.allclose(divisors, torch.ones_like(divisors))  # the scaling changes some frequencies
    return write_gguf(tmp_path / "llama3.gguf", reference_model(cfg), cfg, rope_freqs=divisors), scaled


@torch.no_grad()
def test_awq_folder_from_llama3_gguf_reloads_with_same_logits(tmp_path):
    path, scaled = llama3_gguf(tmp_path)
    model = load_model(resolve(str(path)))
    assert torch.allclose(model.inv_freq, rope_frequencies(scaled))  # the GGUF's factors are applied
    tokens = torch.randint(0, 256, (2, 100), generator=torch.Generator().manual_seed(0))
    awq_quantize(model, tokens[:, :48], AWQSettings(group_size=32))
    want = logits(model, tokens)

    (tmp_path / "tokenizer.json").write_text(tokenizer_json())
    out = save_awq(model, model.config, [tmp_path / "tokenizer.json"], tmp_path / "awq", dtype=torch.float32)
    again = load_model(resolve(str(out)))
    assert torch.equal(again.inv_freq, model.inv_freq)
    assert torch.allclose(logits(again, tokens), want, atol=1e-5, rtol=1e-5)

    again.inv_freq = rope_frequencies(again.config)  # what a loader that ignores rope_freqs would build
    assert not torch.allclose(logits(again, tokens), want, atol=1e-3, rtol=1e-3)


def test_cached_awq_of_llama3_gguf_keeps_its_frequencies(tmp_path):
    path, scaled = llama3_gguf(tmp_path)
    out = ensure_quantized(resolve(str(path)), group_size=32, calib="builtin", n_samples=4, seq_len=32)
    assert torch.allclose(load_model(out).inv_freq, rope_frequencies(scaled))
