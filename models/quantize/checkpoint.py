"""Save and load AWQ checkpoints in the AutoAWQ "GEMM" format, so vLLM / transformers read what Parley writes
and Parley runs `-AWQ` repositories from the hub without re-quantizing.

A folder holds `config.json` (the model's HF config plus `quantization_config`), `model.safetensors`
(HF names: `model.layers.N.self_attn.q_proj.qweight|qzeros|scales`, floating-point tensors in fp16 as
AutoAWQ writes them) and the tokenizer files.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from ..config import ConfigError, ModelConfig
from ..transformer import Transformer, rope_frequencies
from .int4_linear import Int4Linear, decoder_linears

WEIGHTS_NAME = "model.safetensors"


def quantization_config(group_size: int) -> dict[str, Any]:
    return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
            "version": "gemm", "modules_to_not_convert": None}


def awq_group_size(model: nn.Module) -> int:
    sizes = {m.group_size for m in model.modules() if isinstance(m, Int4Linear)}
    if len(sizes) != 1:
        raise ValueError(f"an AWQ checkpoint needs one group size for all layers; the model has {sizes or 'none'}")
    return sizes.pop()


def save_awq(model: Transformer, config: ModelConfig, tokenizer_files: Iterable[str | Path], out_dir: str | Path,
             dtype: torch.dtype = torch.float16) -> Path:
    """Write a quantized model (its decoder linears Int4Linear) as an AutoAWQ GEMM folder.

    Floating-point tensors are stored in `dtype` (fp16, what AWQ consumers expect); the tied output head is
    stored once, as the embedding.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    group_size = awq_group_size(model)
    tensors = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_embeddings:
            continue
        if t.is_floating_point() and not name.endswith(".scales"):
            t = t.to(dtype)
        key = name if name.startswith("lm_head.") else f"model.{name}"
        tensors[key] = t.detach().contiguous().cpu()
    save_file(tensors, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
    hf = config.to_hf()
    hf["quantization_config"] = quantization_config(group_size)
    hf["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    for f in tokenizer_files:
        shutil.copy2(f, out / Path(f).name)
    return out


def check_quantization_config(q: dict[str, Any] | None, source: str) -> int:
    """The group size of a supported AWQ config; a ConfigError saying what is wrong otherwise."""
    if not q or str(q.get("quant_method", "")).lower() != "awq":
        raise ConfigError(f"{source}: quantization_config is not AWQ ({q})")
    problems = []
    if q.get("bits", 4) != 4:
        problems.append(f"bits={q.get('bits')} (4 is supported)")
    if str(q.get("version", "gemm")).lower() != "gemm":
        problems.append(f"version={q.get('version')} (GEMM is supported)")
    if not q.get("zero_point", True):
        problems.append("zero_point=false (asymmetric with zero points is supported)")
    group = q.get("group_size", q.get("q_group_size", 128))
    if not isinstance(group, int) or group <= 0:
        problems.append(f"group_size={group} (a positive group size is supported)")
    if problems:
        raise ConfigError(f"{source}: unsupported AWQ checkpoint: {'; '.join(problems)}")
    return group


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{path}: no .safetensors files in this AWQ folder")
    tensors = {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():  # noqa: SIM118 (safe_open has no __iter__)
                tensors[k.removeprefix("model.")] = sf.get_tensor(k)
    return tensors


@torch.no_grad()
def load_awq_model(path: str | Path, config: ModelConfig, dtype: torch.dtype = torch.float32,
                   device: torch.device | str = "cpu") -> Transformer:
    """A Transformer whose decoder linears are Int4Linear, filled from an AutoAWQ GEMM folder.

    Linears the checkpoint stores unquantized (`modules_to_not_convert`) stay nn.Linear. Floating-point
    tensors are cast to `dtype`; scales stay fp16 as stored.
    """
    path = Path(path)
    q = config.quantization
    if q is None and (path / "config.json").exists():
        q = json.loads((path / "config.json").read_text()).get("quantization_config")
    group_size = check_quantization_config(q, str(path / "config.json"))
    tensors = read_tensors(path)

    with torch.device("meta"):
        model = Transformer(config)
    for parent, name, lin in decoder_linears(model):
        prefix = next(k for k, m in model.named_modules() if m is lin)
        if f"{prefix}.qweight" in tensors:
            setattr(parent, name, Int4Linear(lin.in_features, lin.out_features, group_size,
                                             lin.bias is not None, device="meta", dtype=dtype))
    model = model.to_empty(device=device)
    for p in model.parameters():
        p.data = p.data.to(dtype)
    model.inv_freq = rope_frequencies(config).to(device)  # a computed buffer, lost on the meta device
    if config.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
        tensors.pop("lm_head.weight", None)

    state = model.state_dict()
    missing = [k for k in state if k not in tensors and not (config.tie_embeddings and k == "lm_head.weight")]
    unexpected = [k for k in tensors if k not in state]
    if missing or unexpected:
        raise ConfigError(f"{path}: checkpoint does not match the model: missing {missing[:5]}, "
                          f"unexpected {unexpected[:5]}")
    for name, target in state.items():
        if name == "lm_head.weight" and config.tie_embeddings:
            continue
        t = tensors[name]
        if t.shape != target.shape:
            raise ConfigError(f"{path}: {name} has shape {tuple(t.shape)}, the model expects {tuple(target.shape)}")
        target.copy_(t)  # casts to the buffer's dtype: fp16 scales stay fp16, the rest become `dtype`
    for m in model.modules():
        if isinstance(m, Int4Linear):
            m._prepared = None
    return model.eval()
