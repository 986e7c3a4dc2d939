"""Weights onto a Transformer: safetensors (one file or shards) or GGUF (dequantized), nothing else.

Checkpoint names map onto ours by dropping `model.`; every tensor is checked against the shape the
config implies, so a wrong or damaged file fails here, by name, and not as garbage text later.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from .config import ConfigError, ModelConfig
from .errors import ModelLoadError
from .resolve import ModelFiles, weight_files
from .transformer import Transformer, rope_frequencies


def load_config(files: ModelFiles) -> ModelConfig:
    """The model's config, from config.json or the GGUF metadata."""
    try:
        if files.kind == "gguf":
            from .gguf_weights import open_gguf

            return ModelConfig.from_gguf(open_gguf(files.path))
        return ModelConfig.from_json(files.path / "config.json")
    except ConfigError as e:
        raise ModelLoadError(str(e)) from None


def load_model(files: ModelFiles, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> Transformer:
    """The model in eval mode, its weights in `dtype` on `device`."""
    if files.kind == "gguf":
        return _load_gguf(files.path, dtype, device)
    config = load_config(files)
    if (config.quantization or {}).get("quant_method") == "awq":
        from .quantize.checkpoint import load_awq_model

        return load_awq_model(files.path, config, dtype, device)
    if config.quantization:
        method = config.quantization.get("quant_method")
        raise ModelLoadError(
            f"{files.path / 'config.json'}: quantization {method!r} is not supported; use the unquantized "
            "model (Parley quantizes it to AWQ itself) or an AWQ checkpoint"
        )
    return _assemble(config, _safetensors_weights(files.path, device), dtype, device, str(files.path))


def _safetensors_weights(path: Path, device: torch.device | str) -> Iterator[tuple[str, torch.Tensor]]:
    """(our name, tensor) for every tensor of every shard, read straight onto `device`."""
    for name in weight_files(path):
        file = path / name
        try:
            with safe_open(file, framework="pt", device=str(device)) as f:
                for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    yield key.removeprefix("model."), f.get_tensor(key)
        except FileNotFoundError:
            raise ModelLoadError(f"{file}: missing; re-download the model") from None
        except Exception as e:  # SafetensorError: truncated header or data, bad JSON, wrong offsets
            if isinstance(e, ModelLoadError):
                raise
            raise ModelLoadError(
                f"{file}: not a valid safetensors file ({e}); it is probably truncated or corrupted -- "
                "delete it and download the model again"
            ) from None


def _load_gguf(path: Path, dtype: torch.dtype, device: torch.device | str) -> Transformer:
    from .gguf_weights import iter_weights, open_gguf

    file = open_gguf(path)
    try:
        config = ModelConfig.from_gguf(file)
    except ConfigError as e:
        raise ModelLoadError(str(e)) from None
    weights = iter_weights(file, config.arch, config.n_heads, config.n_kv_heads)
    return _assemble(config, weights, dtype, device, str(path))


def _assemble(config: ModelConfig, weights: Iterator[tuple[str, torch.Tensor]], dtype: torch.dtype,
              device: torch.device | str, source: str) -> Transformer:
    """Build the model without allocating random weights, then place each checkpoint tensor into it."""
    with torch.device("meta"):
        model = Transformer(config)
    expected = {name: p.shape for name, p in model.named_parameters()}  # tied lm_head appears once
    loaded: dict[str, torch.Tensor] = {}
    rope_freqs = None
    for name, tensor in weights:
        if name == "rope_freqs":
            rope_freqs = tensor
            continue
        if name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and config.tie_embeddings):
            continue  # recomputed, or the same tensor as embed_tokens
        if name not in expected:
            raise ModelLoadError(
                f"{source}: unexpected tensor {name!r} for a {config.arch} model; the weights do not match "
                "config.json (a different architecture?)"
            )
        if tuple(tensor.shape) != tuple(expected[name]):
            raise ModelLoadError(
                f"{source}: tensor {name} has shape {tuple(tensor.shape)}, the config implies "
                f"{tuple(expected[name])}; the weights and config.json disagree, re-download the model"
            )
        loaded[name] = tensor.to(device=device, dtype=dtype)
    missing = sorted(set(expected) - set(loaded))
    if missing:
        raise ModelLoadError(
            f"{source}: {len(missing)} tensor(s) missing, e.g. {', '.join(missing[:3])}; "
            "the checkpoint is incomplete, re-download it"
        )
    model.load_state_dict(loaded, strict=False, assign=True)
    if config.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    inv_freq = rope_frequencies(config)
    if rope_freqs is not None:  # llama.cpp stores llama3-style scaling as divisors of each frequency
        inv_freq = inv_freq / rope_freqs.float()
    model.inv_freq = inv_freq.to(device)
    return model.eval()
