"""Save AWQ checkpoints in the AutoAWQ "GEMM" format, so vLLM / transformers read what Parley writes
and Parley runs `-AWQ` repositories from the hub without re-quantizing. Loading is `loading.load_model`'s
(one assembler for every source); this module says what an AWQ config is.

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
from safetensors.torch import save_file
from torch import nn

from ..config import ConfigError, ModelConfig
from ..transformer import Transformer, is_norm_weight, rope_frequencies
from .int4_linear import Int4Linear

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
    stored once, as the embedding. Rotary frequencies that the config alone does not reproduce are stored
    as they are, so the folder reloads with the same positions.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    group_size = awq_group_size(model)
    tensors = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_embeddings:
            continue
        if config.norm_unit_offset and is_norm_weight(name):
            t = t.float() - 1  # Gemma's checkpoints store w for a gain of 1 + w (what transformers reads)
        if t.is_floating_point() and not name.endswith(".scales"):
            t = t.to(dtype)
        key = name if name.startswith("lm_head.") else f"model.{name}"
        tensors[key] = t.detach().contiguous().cpu()
    inv_freq = model.inv_freq.detach().float().cpu()
    if not torch.equal(inv_freq, rope_frequencies(config)):  # e.g. a GGUF's llama3 `rope_freqs` factors
        tensors["model.rotary_emb.inv_freq"] = inv_freq  # transformers and vLLM skip this name
    save_file(tensors, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
    hf = config.to_hf()
    hf["quantization_config"] = quantization_config(group_size)
    hf["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    for f in tokenizer_files:
        shutil.copy2(f, out / Path(f).name)
    return out


def is_awq(quantization: Any) -> bool:
    """Whether a `quantization_config` describes an AWQ checkpoint: the one test of it in Parley."""
    return isinstance(quantization, dict) and str(quantization.get("quant_method", "")).lower() == "awq"


def awq_group_size_of(q: dict[str, Any] | None, source: str) -> int:
    """The group size of a supported AWQ config; a ModelLoadError saying what is wrong otherwise."""
    if not is_awq(q):
        raise ConfigError(f"{source}: quantization_config is not AWQ ({q}); use an AWQ checkpoint")
    assert q is not None
    problems = []
    if q.get("bits", 4) != 4:
        problems.append(f"bits={q.get('bits')} (4 is supported)")
    if str(q.get("version", "gemm")).lower() != "gemm":
        problems.append(f"version={q.get('version')} (GEMM is supported)")
    if not q.get("zero_point", True):
        problems.append("zero_point=false (asymmetric with zero points is supported)")
    group = q.get("group_size", q.get("q_group_size", 128))
    if isinstance(group, bool) or not isinstance(group, int) or group <= 0:
        problems.append(f"group_size={group} (a positive group size is supported)")
    if problems:
        raise ConfigError(f"{source}: unsupported AWQ checkpoint: {'; '.join(problems)}; use a 4-bit GEMM AWQ "
                          "checkpoint, or the unquantized model (Parley quantizes it itself)")
    return group
