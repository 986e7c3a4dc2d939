"""An online Hadamard rotation before down_proj, its INT4 weights kept beside the standard checkpoint.

Why: down_proj's input, the SwiGLU product, has a few channels many times larger than the rest, and unlike
the residual stream (rotate.py) it cannot be rotated offline: the product is elementwise, so no rotation
folds into gate/up. Rotated at run time instead, h -> H (d * h) per block of `block` channels (d = +-1 /
sqrt(block), H the unnormalised Sylvester matrix: n log2(block) additions per token), the outliers are
spread and down_proj, quantized as W diag(d) H, computes the same function in exact arithmetic
(docs/quantization.md, for what it buys).

The standard folder cannot say "rotate here" (transformers would ignore an unknown config key and compute
another function), so it keeps down_proj quantized on its plain input, and this module writes the rotated
down_proj of every layer to `FILE` beside it: transformers and vLLM read the folder as before, Parley's
loader swaps the rotated weights in. The file records the sha256 of the `model.safetensors` it belongs
with, and is ignored (with a warning) beside any other.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from ...cache_files import file_sha256
from ..errors import ModelLoadError
from ..transformer import block_hadamard
from .int4_linear import Int4Linear

log = logging.getLogger("parley.quantize")

FILE = "parley-down-hadamard.safetensors"
FORMAT = "parley-down-hadamard-1"
BLOCK = 256  # blocks of 64, 256 and 512 measured within one seed's noise of each other; 256 ships
DISABLE_ENV = "PARLEY_DOWN_HADAMARD"  # "0": load the standard down_proj even where the file is there


def block_size(n: int, preferred: int = BLOCK) -> int:
    """The largest power of two <= `preferred` dividing n (1 when n is odd: no rotation)."""
    b = preferred
    while n % b:
        b //= 2
    return b


def rotation_diag(n: int, block: int, seed: int = 0) -> Tensor:
    """d [n] fp32: random signs over sqrt(block), so that diag(d) H_block is orthogonal."""
    gen = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (n,), generator=gen).float() * 2 - 1
    return signs / math.sqrt(block)


def sylvester(block: int) -> Tensor:
    """Sylvester's Hadamard matrix of order `block` (a power of two), +-1 in fp32."""
    h = torch.ones(1, 1)
    while h.shape[0] < block:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)))
    return h


def rotate_input(x: Tensor, diag: Tensor, block: int) -> Tensor:
    """What the model feeds down_proj at run time (MLP.forward): H (d * x) per block."""
    return block_hadamard(x * diag.to(x.dtype), sylvester(block).to(x.device))


def rotate_gram(h: Tensor, diag: Tensor, block: int) -> Tensor:
    """The Gram matrix of the rotated inputs from the plain inputs' h [in, in]: R^T h R with R = diag(d) H, in
    h's dtype (two transforms of an in x in matrix instead of another pass over every calibration token; as
    products by H: eight butterfly stages over an 8192-wide Gram in float64 took 45 s a layer)."""
    hd = h * diag.to(h.dtype)[:, None] * diag.to(h.dtype)[None, :]
    sy = sylvester(block).to(h.device)
    return block_hadamard(block_hadamard(hd, sy, matmul=True).t().contiguous(), sy, matmul=True).t()


def rotate_weight(w: Tensor, diag: Tensor, block: int) -> Tensor:
    """W diag(d) H [out, in] in float64: W' H (d * h) = W d^2 H^2 h = W h, since H^2 = block * I and
    d^2 = 1 / block (H is symmetric, so each row times H is the row's own transform)."""
    return block_hadamard(w.double() * diag.double(), sylvester(block).to(w.device), matmul=True)


def save(folder: Path, rotated: dict[int, Int4Linear], diag: Tensor, block: int) -> Path:
    """Write the rotated down_proj of each layer beside `folder`'s model.safetensors (already written)."""
    tensors = {f"layers.{i}.mlp.down_proj.{k}": t.detach().contiguous().cpu()
               for i, lin in rotated.items() for k, t in lin.state_dict().items()}
    tensors["down_diag"] = diag.float().contiguous().cpu()
    meta = {"format": FORMAT, "block": str(block), "model_sha256": file_sha256(folder / "model.safetensors")}
    path = folder / FILE
    save_file(tensors, str(path), metadata=meta)
    return path


def _weights_sha256(folder: Path) -> str:
    """model.safetensors' sha256: from the Parley cache's manifest when there is one (verified at each load)."""
    try:
        return json.loads((folder / "manifest.json").read_text())["files"]["model.safetensors"]["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return file_sha256(folder / "model.safetensors")


@torch.no_grad()
def apply(model: nn.Module, folder: Path, on_use: bool = False) -> bool:
    """Swap in the rotated down_proj of `folder`'s FILE when there is one that belongs with its weights;
    whether it was. A damaged file is a ModelLoadError naming it; one for other weights is skipped.
    `on_use` (a CPU model whose INT4 linears are read on use, models/loading.py): the rotated linears are too."""
    path = folder / FILE
    if not path.is_file() or os.environ.get(DISABLE_ENV, "1") == "0":
        return False
    config = model.config
    try:
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT!r}")
            if meta.get("model_sha256") != _weights_sha256(folder):
                log.warning("%s belongs with other weights than %s; using the standard down_proj", path,
                            folder / "model.safetensors")
                return False
            block = int(meta.get("block", "0"))
            if block < 2 or block & (block - 1) or config.intermediate_size % block:
                raise ValueError(f"block {block} is not a power of two dividing {config.intermediate_size}")
            diag = f.get_tensor("down_diag") if "down_diag" in f.keys() else None  # noqa: SIM118
            stored = {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype())
                      for k in f.keys() if k != "down_diag"}  # noqa: SIM118 (safe_open is not a dict)
    except FileNotFoundError:
        return False
    except ModelLoadError:
        raise
    except Exception as e:  # SafetensorError, a bad header or metadata
        raise ModelLoadError(f"{path}: not a valid rotated down_proj file ({e}); delete it (the model then "
                             "runs its standard down_proj) or re-quantize with `parley quantize --rebuild`") from None
    if diag is None or tuple(diag.shape) != (config.intermediate_size,) or not bool(torch.isfinite(diag).all()):
        raise ModelLoadError(f"{path}: down_diag missing or not [{config.intermediate_size}] finite values; "
                             "re-quantize with `parley quantize --rebuild`")
    device = model.norm.weight.device
    swaps: list[Int4Linear] = []
    for i, layer in enumerate(model.layers):
        old = layer.mlp.down_proj
        if not isinstance(old, Int4Linear):
            raise ModelLoadError(f"{path}: layer {i}'s down_proj is not INT4 in the folder; re-quantize it")
        new = Int4Linear(old.in_features, old.out_features, old.group_size, device="meta")  # filled below
        for k, t in new.state_dict().items():
            shape, dtype = stored.pop(f"layers.{i}.mlp.down_proj.{k}", ((), ""))
            if shape != tuple(t.shape) or dtype != _STORED_DTYPE[t.dtype]:
                raise ModelLoadError(f"{path}: layers.{i}.mlp.down_proj.{k} missing or not {tuple(t.shape)} "
                                     f"{t.dtype}; re-quantize with `parley quantize --rebuild`")
        read = _rotated_reader(path, i, new)
        if on_use and device.type == "cpu":
            new.read_on_use(read)
        else:
            for k, got in read().items():
                setattr(new, k, got.to(device))
        swaps.append(new)
    if stored:
        raise ModelLoadError(f"{path}: unexpected tensors, e.g. {next(iter(stored))!r}; re-quantize it")
    install(model, dict(enumerate(swaps)), diag, block)
    return True


_STORED_DTYPE = {torch.int32: "I32", torch.float16: "F16"}


def _rotated_reader(path: Path, i: int, lin: Int4Linear) -> Callable[[], dict[str, Tensor]]:
    """Layer i's rotated down_proj tensors from `path` (shapes checked at load), each checked finite."""
    names = list(lin.state_dict())

    def read() -> dict[str, Tensor]:
        out = {}
        try:
            with safe_open(path, framework="pt") as f:
                for k in names:
                    out[k] = f.get_tensor(f"layers.{i}.mlp.down_proj.{k}")
        except Exception as e:  # replaced or damaged since the load
            raise ModelLoadError(f"{path}: layer {i}'s rotated down_proj no longer reads ({e}); re-quantize "
                                 "with `parley quantize --rebuild`") from None
        for k, got in out.items():
            if got.is_floating_point() and not bool(torch.isfinite(got).all()):
                raise ModelLoadError(f"{path}: layers.{i}.mlp.down_proj.{k} holds NaN or infinite values; "
                                     "re-quantize with `parley quantize --rebuild`")
        return out
    return read


def install(model: nn.Module, rotated: dict[int, nn.Module], diag: Tensor, block: int) -> None:
    """Put each layer's rotated down_proj in place, and the rotation MLP.forward applies before it (one copy of
    the signs and of the block's matrix, shared by the layers)."""
    where = {"device": model.norm.weight.device, "dtype": model.norm.weight.dtype}
    d, h = diag.to(**where), sylvester(block).to(**where)
    for i, lin in rotated.items():
        mlp = model.layers[i].mlp
        mlp.down_proj, mlp.down_diag, mlp.down_hadamard = lin, d, h
