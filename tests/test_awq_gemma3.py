"""AWQ on a tiny Gemma 3 (sandwich norms, GeGLU, sliding-window layers): folding the searched scales keeps
the fp logits (the MLP's scales go into `pre_feedforward_layernorm`, the norm that feeds it), and the saved
AWQ folder stores Gemma's norms as transformers reads them (w for a gain of 1 + w) and loads back."""

import json

import pytest
import torch
from awq_tiny import logits
from test_awq_checkpoint_loads import fp16_rounded, tokenizer_files

from parley.models.config import ModelConfig
from parley.models.loading import load_model
from parley.models.quantize.awq import AWQSettings, awq_quantize
from parley.models.quantize.checkpoint import save_awq
from parley.models.quantize.int4_linear import Int4Linear
from parley.models.quantize.methods import applied_method, first_run_settings, method_name
from parley.models.resolve import resolve
from parley.models.transformer import Transformer

SEED = 0
HF = dict(model_type="gemma3_text", vocab_size=259, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
          num_attention_heads=4, num_key_value_heads=1, head_dim=64, max_position_embeddings=256, sliding_window=16,
          layer_types=["sliding_attention", "full_attention", "sliding_attention"], query_pre_attn_scalar=64)


def gemma_outlier_model() -> Transformer:
    torch.manual_seed(SEED)
    model = Transformer(ModelConfig.from_hf(HF)).eval()
    with torch.no_grad():
        for block in model.layers:
            for norm in (block.input_layernorm, block.pre_feedforward_layernorm, block.post_attention_layernorm,
                         block.post_feedforward_layernorm):
                norm.weight.copy_(1 + 0.1 * torch.randn(128))
            for norm in (block.input_layernorm, block.pre_feedforward_layernorm):
                norm.weight[torch.randperm(128)[:4]] *= 20  # salient channels
    return model


def tokens(n: int = 4, t: int = 48) -> torch.Tensor:
    return torch.randint(0, 256, (n, t), generator=torch.Generator().manual_seed(SEED))


@torch.no_grad()
def test_scale_folding_keeps_logits():
    model, x = gemma_outlier_model(), tokens()
    before = logits(model, x)
    mlp_norms = [b.pre_feedforward_layernorm.weight.clone() for b in model.layers]
    report = awq_quantize(model, x, AWQSettings(group_size=32), quantize=False)
    torch.testing.assert_close(logits(model, x), before, atol=1e-4, rtol=1e-4, msg=f"seed {SEED}")
    assert all(layer.alphas["gate_up"] > 0 for layer in report.layers)
    assert any(not torch.equal(n, b.pre_feedforward_layernorm.weight) for n, b in zip(mlp_norms, model.layers,
                                                                                       strict=True))


@torch.no_grad()
def test_saved_folder_stores_gemma_norms_and_loads_back(tmp_path):
    transformers = pytest.importorskip("transformers")
    model, x = gemma_outlier_model(), tokens(3, 40)
    awq_quantize(model, x, AWQSettings(group_size=32))
    fp16_rounded(model)
    out = save_awq(model, model.config, tokenizer_files(tmp_path), tmp_path / "awq")
    from safetensors.torch import load_file

    stored = load_file(str(out / "model.safetensors"))
    gain = model.layers[1].post_feedforward_layernorm.weight
    torch.testing.assert_close(stored["model.layers.1.post_feedforward_layernorm.weight"].float() + 1, gain,
                               atol=1e-3, rtol=0)
    cfg = json.loads((out / "config.json").read_text())
    ref_cfg = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "quantization_config"})
    assert ref_cfg.layer_types == HF["layer_types"] and ref_cfg.sliding_window == 16
    assert ref_cfg.query_pre_attn_scalar == 64 and ref_cfg.hidden_activation == "gelu_pytorch_tanh"
    loaded = load_model(resolve(str(out)))
    assert isinstance(loaded.layers[0].mlp.gate_proj, Int4Linear)
    torch.testing.assert_close(logits(loaded, x), logits(model, x), atol=2e-3, rtol=2e-3)


@torch.no_grad()
def test_the_method_named_is_the_one_applied():
    """Gemma 3 is not rotated, so its folder (and `bench quality`) must not claim rotate+awq+gptq."""
    settings = first_run_settings(32, torch.device("cpu"))
    settings.search_samples = 2
    report = awq_quantize(gemma_outlier_model(), tokens(2, 32), settings)
    named = applied_method({"method": method_name(settings), "rotated": report.rotated})
    assert method_name(settings) == "rotate+awq-no-down-scale+clip-qk+gptq+refit+hadamard-down256+distill"
    assert not report.rotated
    assert named == "awq-no-down-scale+clip-qk+gptq+refit+hadamard-down256+distill"
    assert applied_method({"method": "rotate+awq+gptq", "rotated": True}) == "rotate+awq+gptq"
