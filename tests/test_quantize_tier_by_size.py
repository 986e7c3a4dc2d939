"""A first run's method is chosen by size and device: the full method for the embedded 135M model, AWQ (no
GPTQ, no distillation) for 1B and 8B shapes on a CPU, and the full method at every size on a GPU."""

from parley.models.config import ModelConfig
from parley.models.quantize.tiers import choose_tier, decoder_params

SMOL = ModelConfig(arch="llama", vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3,
                   intermediate_size=1536)
LLAMA_1B = ModelConfig(arch="llama", vocab_size=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8,
                       intermediate_size=8192)
LLAMA_8B = ModelConfig(arch="llama", vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                       intermediate_size=14336)


def test_decoder_parameters_of_real_shapes():
    assert round(decoder_params(LLAMA_1B) / 1e6) == 973  # 1.24B with the 128k-token embedding
    assert round(decoder_params(LLAMA_8B) / 1e9, 2) == 6.98


def test_tiers_by_size_and_device():
    assert [choose_tier(c, "cpu") for c in (SMOL, LLAMA_1B, LLAMA_8B)] == ["full", "awq", "awq"]
    assert [choose_tier(c, "cpu", fast_bf16=True) for c in (SMOL, LLAMA_1B, LLAMA_8B)] == ["full", "awq", "awq"]
    assert [choose_tier(c, "cuda") for c in (SMOL, LLAMA_1B, LLAMA_8B)] == ["full"] * 3
