"""Small random models with real head sizes (64) and grouped-query attention, for the native step's tests."""

from __future__ import annotations

import torch
from torch import nn

from parley.models.config import ModelConfig
from parley.models.quantize import hadamard
from parley.models.quantize.int4_linear import Int4Linear, decoder_linears
from parley.models.transformer import Transformer


def small_model(int4: bool, seed: int = 0, arch: str = "llama", norms: bool = False) -> Transformer:
    """Weights N(0, 0.08); norm weights 1, or (norms=True) distinct random weights around 1 for every norm,
    so that a step that reads one norm's weights in place of another's gives other logits."""
    torch.manual_seed(seed)
    cfg = ModelConfig(arch=arch, vocab_size=300, dim=128, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=64,
                      intermediate_size=256, max_seq_len=600, qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3")
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.empty_like(p).uniform_(0.3, 1.7) if norms else torch.ones_like(p))
            else:
                p.normal_(0, 0.08)
    if int4:
        for parent, name, lin in decoder_linears(model):
            setattr(parent, name, Int4Linear.from_linear(lin, 64))
    return model


def rotate_fp(model: Transformer, block: int, seed: int) -> None:
    """Install the down projection's rotation on an fp model, its down_proj weights rotated to match."""
    inter, rotated = model.config.intermediate_size, {}
    d = hadamard.rotation_diag(inter, block, seed)
    for i, layer in enumerate(model.layers):
        down = layer.mlp.down_proj
        lin = nn.Linear(down.in_features, down.out_features, bias=False)
        lin.weight.data = hadamard.rotate_weight(down.weight.data, d, block).float()
        rotated[i] = lin
    hadamard.install(model, rotated, d, block)


def logits_in_chunks(model: Transformer, ids: list[int], chunks: list[int], kind: str, step=None) -> torch.Tensor:
    """Run `ids` through a fresh cache in passes of the given sizes (on `step`, else the model's own forward);
    logits of every position."""
    cache = model.new_cache(600, kind=kind)
    step = step or model
    out, start = [], 0
    with torch.inference_mode():
        for n in chunks:
            t = torch.tensor([ids[start : start + n]])
            pos = torch.arange(start, start + n)[None]
            out.append(step(t, pos, cache)[0])
            start += n
    return torch.cat(out)
