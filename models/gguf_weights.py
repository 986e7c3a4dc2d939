"""Reading a GGUF file: its metadata as plain values, its tensors dequantized under Hugging Face names.

llama.cpp's converter renames every tensor (`blk.3.attn_q.weight` for `model.layers.3.self_attn.q_proj.weight`)
and, for the llama family, permutes the rows of q/k so that its rotary kernel can rotate adjacent pairs.
Our Transformer rotates halves, as Hugging Face does, so those rows are permuted back here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from .errors import ModelLoadError

# GGUF tensor name (after `blk.N.`) -> our parameter name (after `layers.N.`).
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}

# Architectures whose converter permuted q/k rows for llama.cpp's "normal" (adjacent-pair) rotary.
_PERMUTED_ARCHS = ("llama",)


def open_gguf(path: str | Path) -> gguf.GGUFReader:
    """The file memory-mapped and its header parsed; a clear error when it is not a readable GGUF."""
    path = Path(path)
    try:
        return gguf.GGUFReader(path)
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: no such file; pass the path of an existing .gguf file") from None
    except Exception as e:  # a truncated or foreign file fails in many ways inside the reader
        raise ModelLoadError(
            f"{path}: not a readable GGUF file ({type(e).__name__}: {e}); re-download it or pass another model"
        ) from None


def metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """Every key-value field as a Python value (strings, numbers, lists)."""
    out: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        out[name] = field.contents()
    return out


def gguf_to_hf_name(name: str) -> str | None:
    """Our parameter name for a GGUF tensor name, or None for tensors we do not load as parameters."""
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    m = re.fullmatch(r"(\w+)\.(weight|bias)", name)
    if m and m.group(1) in _TOP_NAMES:
        return f"{_TOP_NAMES[m.group(1)]}.{m.group(2)}"
    return None


def unpermute_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo convert_hf_to_gguf's `permute`: per head, rows [pairs interleaved] back to [halves]."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def dequantize(tensor: gguf.ReaderTensor, path: Path) -> torch.Tensor:
    """One tensor as fp32 in PyTorch's [out, in] order, whatever its GGUF type."""
    kind = gguf.GGMLQuantizationType(tensor.tensor_type)
    try:
        array = gguf.quants.dequantize(tensor.data, kind)
    except NotImplementedError:
        raise ModelLoadError(
            f"{path}: tensor {tensor.name} is stored as {kind.name}, which Parley cannot dequantize; "
            "use a GGUF of type F32, F16, BF16, Q4_0/1, Q5_0/1, Q8_0, a K-quant (Q2_K..Q6_K) or an IQ type"
        ) from None
    return torch.from_numpy(np.array(array, dtype=np.float32))  # a copy: the file is mapped read-only


def iter_weights(reader: gguf.GGUFReader, path: Path, arch: str, n_heads: int,
                 n_kv_heads: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(our name, fp32 tensor) for every parameter in the file, with q/k rows un-permuted."""
    for tensor in reader.tensors:
        name = gguf_to_hf_name(tensor.name)
        if name is None:
            if tensor.name == "rope_freqs.weight":  # llama3 rope scaling, as per-frequency divisors
                yield "rope_freqs", dequantize(tensor, path)
            continue
        w = dequantize(tensor, path)
        if arch in _PERMUTED_ARCHS and name.endswith(("q_proj.weight", "q_proj.bias")):
            w = unpermute_rotary(w, n_heads)
        elif arch in _PERMUTED_ARCHS and name.endswith(("k_proj.weight", "k_proj.bias")):
            w = unpermute_rotary(w, n_kv_heads)
        yield name, w
