"""A saved AWQ folder (AutoAWQ GEMM layout + quantization_config) loads back through the normal loader
and gives the same logits as the quantized model in memory; a hub-style AutoAWQ config loads too."""

import json

import torch
from awq_tiny import logits, outlier_model
from tiny_models import tokenizer_json

from parley.models.config import ModelConfig
from parley.models.loading import load_model
from parley.models.quantize.awq import AWQSettings, awq_quantize
from parley.models.quantize.checkpoint import save_awq
from parley.models.quantize.int4_linear import Int4Linear
from parley.models.resolve import resolve


@torch.no_grad()
def fp16_rounded(model):
    """The in-memory model with its floating-point tensors rounded to fp16, as the checkpoint stores them."""
    for t in list(model.parameters()) + [m.bias for m in model.modules() if isinstance(m, Int4Linear)]:
        if t is not None:
            t.data = t.data.half().float()
    return model


def tokenizer_files(tmp_path):
    (tmp_path / "tokenizer.json").write_text(tokenizer_json())
    return [tmp_path / "tokenizer.json"]


@torch.no_grad()
def test_saved_folder_loads_with_same_logits(tmp_path):
    model = outlier_model(qkv_bias=True)  # biases travel with the int4 tensors
    tokens = torch.randint(0, 256, (3, 40), generator=torch.Generator().manual_seed(0))
    report = awq_quantize(model, tokens, AWQSettings(group_size=64))
    fp16_rounded(model)
    want = logits(model, tokens)

    out = save_awq(model, model.config, tokenizer_files(tmp_path), tmp_path / "awq")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"] == {"quant_method": "awq", "bits": 4, "group_size": report.group_size,
                                          "zero_point": True, "version": "gemm", "modules_to_not_convert": None}
    loaded = load_model(resolve(str(out)))
    assert isinstance(loaded.layers[0].self_attn.q_proj, Int4Linear)
    assert loaded.layers[1].mlp.down_proj.qweight.shape == (256, 128 // 8)  # [in, out / 8]
    assert (out / "tokenizer.json").is_file()
    torch.testing.assert_close(logits(loaded, tokens), want, atol=0, rtol=0)


@torch.no_grad()
def test_hub_style_autoawq_config(tmp_path):
    """AutoAWQ writes "version": "GEMM" and extra keys; tied embeddings store no lm_head."""
    model = outlier_model()
    model.config.tie_embeddings = True
    model.lm_head.weight = model.embed_tokens.weight
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    awq_quantize(model, tokens, AWQSettings(group_size=32))
    fp16_rounded(model)
    out = save_awq(model, model.config, tokenizer_files(tmp_path), tmp_path / "hub")
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True,
                                  "version": "GEMM", "modules_to_not_convert": None}
    (out / "config.json").write_text(json.dumps(cfg))
    loaded = load_model(resolve(str(out)))
    assert ModelConfig.from_json(out / "config.json").tie_embeddings
    assert loaded.lm_head.weight is loaded.embed_tokens.weight
    torch.testing.assert_close(logits(loaded, tokens), logits(model, tokens), atol=0, rtol=0)
