"""Quantize a checkpoint one decoder layer at a time: the fp model is never held whole, and a first run that
was killed resumes from its last finished layer.

Why: an 8B checkpoint is 32 GB in fp32, more than a laptop has, while one of its layers is under 1 GB. Each
layer is read by name from the safetensors shards (or the GGUF), rotated (rotate.py), scaled, clipped and
rounded (awq.awq_layer), written to a file of its own in a work folder beside the cache, and dropped. The
calibration activations it hands on (the fp layer's outputs, which AutoAWQ feeds the next layer) are written
with it, so the next start carries on from there.

Nothing half-written is trusted: every file is written under a temporary name, flushed and renamed
(parley.cache_files), and only then named in the work folder's `state.json` (itself replaced atomically) with
its sha256, which a resumed
run checks before it uses the file. The finished folder is assembled from those files by the cache (cache.py),
which renames it into place whole.

The distillation (distill.py) needs the fp model's next-token distribution: the activations after the last
layer already are the fp model's, so its answers come from the head at the end of the walk, layer-wise too,
and only the distillation itself holds the (INT4) model whole. Where that does not pay (time or memory) the
tier leaves it out (`tiers.py`).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor, nn

from ...cache_files import file_sha256, save_safetensors_atomic, write_json_atomic
from ..config import ModelConfig
from ..errors import ModelLoadError
from ..progress import Progress, ProgressFn
from ..resolve import ModelFiles, weight_files
from ..transformer import Block, RMSNorm, Transformer, is_norm_weight
from . import hadamard
from .awq import AWQSettings, LayerRunner, awq_layer, model_group_size
from .distill import Targets
from .int4_linear import Int4Linear
from .rotate import Rotation

STATE = "state.json"
WORK_FORMAT = 1


class WeightSource:
    """A checkpoint's tensors by our name (`layers.3.mlp.up_proj.weight`), each read when asked for, in fp32:
    safetensors shards through `safe_open` (nothing else is read), a GGUF through its memory map."""

    def __init__(self, files: ModelFiles, config: ModelConfig) -> None:
        self.files, self.config = files, config
        self.where: dict[str, Any] = {}
        if files.kind == "gguf":
            from ..gguf_weights import open_gguf

            self.gguf = open_gguf(files.path)
            self._index_gguf()
        else:
            path = Path(files.path)
            for shard in weight_files(path):
                file = path / shard
                try:
                    with safe_open(file, framework="pt") as f:
                        for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                            self.where[key.removeprefix("model.")] = (file, key)
                except FileNotFoundError:
                    raise ModelLoadError(f"{file}: missing; re-download the model") from None
                except Exception as e:  # SafetensorError: a truncated or damaged header
                    raise ModelLoadError(f"{file}: not a valid safetensors file ({e}); it is probably truncated "
                                         "or corrupted -- delete it and download the model again") from None

    def _index_gguf(self) -> None:
        from ..gguf_weights import gguf_to_hf_name

        for t in self.gguf.tensors:
            name = gguf_to_hf_name(t.name, self.config.arch)
            if name is not None:
                self.where[name] = t
            elif t.name == "rope_freqs.weight":
                self.where["rope_freqs"] = t

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def names(self) -> set[str]:
        return set(self.where)

    def get(self, name: str) -> Tensor:
        """The tensor in fp32 (as `loading` would place it: q/k un-permuted, Gemma's norms as gains)."""
        if name not in self.where:
            raise ModelLoadError(f"{self.files.path}: tensor {name!r} missing; the checkpoint is incomplete, "
                                 "re-download it")
        if self.files.kind == "gguf":
            from ..gguf_weights import dequantize, permuted_heads, unpermute_rotary

            t = dequantize(self.where[name], Path(self.files.path))
            heads = permuted_heads(name, self.config.arch, self.config.n_heads, self.config.n_kv_heads)
            return unpermute_rotary(t, heads) if heads else t
        file, key = self.where[name]
        try:
            with safe_open(file, framework="pt") as f:
                t = f.get_tensor(key)
        except Exception as e:
            raise ModelLoadError(f"{file}: tensor {key} cannot be read ({e}); the file is truncated or "
                                 "corrupted -- delete it and download the model again") from None
        if not t.is_floating_point() or not bool(torch.isfinite(t).all()):
            raise ModelLoadError(f"{file}: tensor {key} is not finite floating point; the file is damaged, "
                                 "re-download the model")
        t = t.float()
        if self.config.norm_unit_offset and is_norm_weight(name):
            t = t + 1  # Gemma stores w for a gain of 1 + w; the model holds the gain
        return t


@torch.no_grad()
def read_block(src: WeightSource, config: ModelConfig, i: int, dtype: torch.dtype) -> Block:
    """Decoder layer i in `dtype`, its tensors checked against the shapes the config implies."""
    from ..loading import _no_random_init

    with _no_random_init():
        block = Block(config, i)
    expected = block.state_dict()
    placed = {}
    for name, want in expected.items():
        t = src.get(f"layers.{i}.{name}")
        if tuple(t.shape) != tuple(want.shape):
            raise ModelLoadError(f"{src.files.path}: tensor layers.{i}.{name} has shape {tuple(t.shape)}, the "
                                 f"config implies {tuple(want.shape)}; the weights and the config disagree, "
                                 "re-download the model")
        placed[name] = t.to(dtype)
    block.load_state_dict(placed, assign=True)
    return block.eval()


def read_tensor(path: Path, name: str) -> Tensor:
    with safe_open(path, framework="pt") as f:
        return f.get_tensor(name)


def read_safetensors(path: Path) -> dict[str, Tensor]:
    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)


@dataclass
class WorkState:
    """What a work folder holds: for `key`, the finished layers' files and the activations after the last."""

    key: dict[str, Any]
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    layers_done: int = 0  # layers 0 .. layers_done - 1 are in their files
    seconds: float = 0.0  # spent on the layers so far, over every run

    def save(self, folder: Path) -> None:
        write_json_atomic(folder / STATE, {"format": WORK_FORMAT, "key": self.key, "files": self.files,
                                            "layers_done": self.layers_done, "seconds": self.seconds}, indent=1)


def resume_state(folder: Path, key: dict[str, Any]) -> tuple[WorkState, str]:
    """The work folder's state for `key`, every file it names checked; a fresh state (and why) otherwise."""
    try:
        raw = json.loads((folder / STATE).read_text())
    except FileNotFoundError:
        return WorkState(key), "nothing to resume"
    except (OSError, ValueError) as e:
        return WorkState(key), f"unreadable state ({e})"
    if not isinstance(raw, dict) or raw.get("format") != WORK_FORMAT or raw.get("key") != key:
        return WorkState(key), "the work folder is for another source or other settings"
    files, done = raw.get("files"), raw.get("layers_done")
    if not isinstance(files, dict) or not isinstance(done, int) or done < 0:
        return WorkState(key), "malformed state"
    for name, digest in files.items():
        path = folder / str(name)
        if Path(str(name)).name != name or not path.is_file() or file_sha256(path) != digest:
            return WorkState(key), f"{name} is missing or does not match its sha256"
    seconds = raw.get("seconds")
    return WorkState(key, dict(files), done, float(seconds) if isinstance(seconds, (int, float)) else 0.0), ""


def layer_file(i: int) -> str:
    return f"layer-{i:05d}.safetensors"


@dataclass
class StreamResult:
    """What the walk produced, for the cache to assemble and the manifest to record."""

    config: ModelConfig  # as the quantized checkpoint is (untied when rotated)
    group_size: int
    rotated: bool
    down_block: int
    targets: Targets | None
    layer_seconds: list[float]
    resumed_from: int  # 0: a fresh walk
    seconds: float


def work_folder(folder: Path) -> Path:
    return folder.with_name(f".work-{folder.name}")


@torch.no_grad()
def quantize_layers(files: ModelFiles, config: ModelConfig, key: dict[str, Any], work: Path, awq: AWQSettings,
                    tokens: Tensor, awq_rows: Tensor, device: torch.device, dtype: torch.dtype,
                    top_k: int = 0, progress: ProgressFn | None = None, calibrated: bool = True) -> StreamResult:
    """Walk the checkpoint layer by layer into `work`, resuming where a previous walk for `key` stopped.

    `tokens` [N, T] are carried through every layer; AWQ calibrates each layer on the rows `awq_rows`, and
    with `top_k` the fp model's top-k answers on all of them are returned for the distillation. Not
    `calibrated`: every linear is rounded to nearest and no activation is computed.
    """
    start = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    state, why = resume_state(work, key)
    if state.layers_done == 0:  # nothing usable: start clean (stale files of another key go too)
        for p in work.iterdir():
            if p.is_file():
                p.unlink()
        state = WorkState(key)
    elif progress:
        progress(Progress("quantize", state.layers_done, config.n_layers, "layer",
                          f"resuming after layer {state.layers_done} of {config.n_layers}"))
    src = WeightSource(files, config)
    rotate = awq.rotate and config.family.rotatable
    out_config = replace(config, tie_embeddings=config.tie_embeddings and not rotate)
    q = Rotation(config.dim, awq.rotation_seed) if rotate else None
    with torch.device("meta"):
        skeleton = Transformer(config)  # shapes only: the group size and LayerRunner's rotary tables
    group_size = model_group_size(skeleton, awq.group_size)
    skeleton.inv_freq = _inv_freq(src, config)
    if config.local_rope:
        from ..transformer import rope_frequencies

        skeleton.inv_freq_local = rope_frequencies(config, local=True)

    if "top.safetensors" not in state.files:  # embedding, final norm and head: rotated, the norm folded in
        state.files["top.safetensors"] = save_safetensors_atomic(work / "top.safetensors",
                                                                 _top_tensors(src, config, q, skeleton.inv_freq))
        state.save(work)
    top = work / "top.safetensors"

    down_rotation, down_block = None, 0
    if awq.hadamard_down:
        down_block = hadamard.block_size(config.intermediate_size, awq.hadamard_down)
        if down_block > 1:
            diag = hadamard.rotation_diag(config.intermediate_size, down_block, awq.hadamard_seed)
            down_rotation = (diag.to(device), down_block)
        else:
            down_block = 0

    run = LayerRunner(skeleton, tokens.shape[1], device, dtype, awq.chunk)
    resumed_from = state.layers_done
    if not calibrated:
        x = torch.empty(0)
    elif state.layers_done:
        x = read_safetensors(work / f"x-{state.layers_done:05d}.safetensors")["x"].to(device)
    else:
        x = _embed(read_tensor(top, "embed_tokens.weight"), tokens, config).to(device=device, dtype=dtype)
    others = torch.ones(len(tokens), dtype=torch.bool)
    others[awq_rows] = False
    times: list[float] = []
    n = config.n_layers
    for i in range(state.layers_done, n):
        t0 = time.monotonic()
        block = read_block(src, config, i, dtype)
        if q is not None:
            _rotate_block(block, q)
        block.to(device)
        if calibrated:
            x_rest = run.block(block, x[others]) if bool(others.any()) else None  # the fp layer, before AWQ
            x_awq, _alphas, rotated_down = awq_layer(block, x[awq_rows], run, awq, group_size, True, down_rotation)
            x_next = torch.empty_like(x)
            x_next[awq_rows] = x_awq
            if x_rest is not None:
                x_next[others] = x_rest
            x = x_next
            del x_next, x_rest, x_awq
        else:
            rotated_down = round_layer(block, group_size, down_rotation)
        tensors = {f"layers.{i}.{k}": v for k, v in block.state_dict().items()}
        if rotated_down is not None:
            tensors.update({f"rotated.layers.{i}.mlp.down_proj.{k}": v for k, v in rotated_down.state_dict().items()})
        state.files[layer_file(i)] = save_safetensors_atomic(work / layer_file(i), tensors)
        old_x = work / f"x-{state.layers_done:05d}.safetensors"
        if calibrated:
            state.files[f"x-{i + 1:05d}.safetensors"] = save_safetensors_atomic(work / f"x-{i + 1:05d}.safetensors",
                                                                                {"x": x})
        state.files.pop(old_x.name, None)
        state.layers_done = i + 1
        times.append(time.monotonic() - t0)
        state.seconds += times[-1]
        state.save(work)  # only now does a resumed run trust layer i
        old_x.unlink(missing_ok=True)
        del block, tensors
        if progress:
            eta = sum(times) / len(times) * (n - i - 1)
            progress(Progress("quantize", i + 1, n, "layer", f"layer {i + 1}/{n}, ETA {eta:.0f}s", eta))
    targets = _answers(x, top, config, top_k, dtype) if top_k else None
    return StreamResult(out_config, group_size, rotate, down_block, targets, times, resumed_from,
                        state.seconds if resumed_from else time.monotonic() - start)


@torch.no_grad()
def round_layer(block: Block, group_size: int, down_rotation: tuple[Tensor, int] | None) -> Int4Linear | None:
    """Every decoder linear of `block` rounded to nearest in place; with `down_rotation`, down_proj on its
    rotated input too (returned)."""
    from .int4_linear import LINEAR_NAMES

    rotated = None
    if down_rotation is not None:
        w = block.mlp.down_proj.weight.data
        lin = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
        lin.weight.data = hadamard.rotate_weight(w, down_rotation[0].to(w.device), down_rotation[1]).to(w.dtype)
        rotated = Int4Linear.from_linear(lin, group_size)
    for parent in (block.self_attn, block.mlp):
        for name in LINEAR_NAMES:
            if hasattr(parent, name):
                setattr(parent, name, Int4Linear.from_linear(getattr(parent, name), group_size))
    return rotated


def _inv_freq(src: WeightSource, config: ModelConfig) -> Tensor:
    from ..loading import _rotary_frequencies

    rope_freqs = src.get("rope_freqs") if "rope_freqs" in src else None
    stored = src.get("rotary_emb.inv_freq") if "rotary_emb.inv_freq" in src else None
    return _rotary_frequencies(config, rope_freqs, stored, str(src.files.path))


def _top_tensors(src: WeightSource, config: ModelConfig, q: Rotation | None, inv_freq: Tensor) -> dict[str, Tensor]:
    """Embedding, final norm, head (and the rotary frequencies): with a rotation, the final norm folded into
    the head (then its own tensor: a tied head no longer equals the embedding) and both rotated."""
    def checked(name: str, shape: tuple[int, ...]) -> Tensor:
        t = src.get(name)
        if tuple(t.shape) != shape:
            raise ModelLoadError(f"{src.files.path}: tensor {name} has shape {tuple(t.shape)}, the config implies "
                                 f"{shape}; the weights and the config disagree, re-download the model")
        return t

    embed = checked("embed_tokens.weight", (config.vocab_size, config.dim))
    norm = checked("norm.weight", (config.dim,))
    head = embed if config.tie_embeddings else checked("lm_head.weight", (config.vocab_size, config.dim))
    out = {"inv_freq": inv_freq.float()}
    if q is None:
        out.update({"embed_tokens.weight": embed, "norm.weight": norm})
        if not config.tie_embeddings:
            out["lm_head.weight"] = head
        return out
    out.update({"embed_tokens.weight": _rows_rotated(embed, q), "norm.weight": torch.ones_like(norm),
                "lm_head.weight": _rows_rotated(head, q, norm)})
    return out


def _rows_rotated(w: Tensor, q: Rotation, scale: Tensor | None = None) -> Tensor:
    """(w * scale) @ Q in fp32, a slice of rows at a time: a 128k-token embedding in float64 whole would be
    several GB of intermediates."""
    out = torch.empty(w.shape, dtype=torch.float32)
    for i in range(0, w.shape[0], 8192):
        part = w[i:i + 8192].double()
        out[i:i + 8192] = q.right(part if scale is None else part * scale.double()[None, :]).float()
    return out


def _embed(weight: Tensor, tokens: Tensor, config: ModelConfig) -> Tensor:
    x = nn.functional.embedding(tokens, weight)
    if config.embed_scale:  # sqrt(dim) rounded to the weights' dtype first, as Transformer.embed
        x = x * torch.tensor(config.dim ** 0.5).to(x.dtype)
    return x


def _rotate_block(block: Block, q: Rotation) -> None:
    from .rotate import rotate_block

    rotate_block(block, q)


def _answers(x: Tensor, top: Path, config: ModelConfig, top_k: int, dtype: torch.dtype,
             chunk: int = 4) -> Targets:
    """The fp model's top-k log-probabilities from the activations after its last layer."""
    norm = RMSNorm(config.dim, config.norm_eps).to(x.device)
    norm.weight.data = read_tensor(top, "norm.weight").to(x.device, torch.float32)
    with safe_open(top, framework="pt") as f:
        names = set(f.keys())
        head = f.get_tensor("lm_head.weight" if "lm_head.weight" in names else "embed_tokens.weight")
    head = head.to(x.device)
    logps, indices = [], []
    for part in x.split(chunk):
        with torch.autocast(part.device.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = nn.functional.linear(norm(part.float()), head)
        found = torch.log_softmax(logits.float(), -1).topk(top_k, dim=-1)
        logps.append(found.values)
        indices.append(found.indices)
    return Targets(torch.cat(logps), torch.cat(indices))


def quantized_weights(work: Path, n_layers: int) -> Iterator[tuple[str, Tensor]]:
    """(our name, tensor) of the quantized model in `work`, for `loading.assemble`; rotated down_projs apart."""
    for name, t in read_safetensors(work / "top.safetensors").items():
        if name == "inv_freq":
            yield "rotary_emb.inv_freq", t
        else:
            yield name, t
    for i in range(n_layers):
        for name, t in read_safetensors(work / layer_file(i)).items():
            if not name.startswith("rotated."):
                yield name, t


def rotated_downs(work: Path, n_layers: int, group_size: int) -> dict[int, Int4Linear]:
    out = {}
    for i in range(n_layers):
        prefix = f"rotated.layers.{i}.mlp.down_proj."
        parts = {k.removeprefix(prefix): t for k, t in read_safetensors(work / layer_file(i)).items()
                 if k.startswith(prefix)}
        if not parts:
            continue
        lin = Int4Linear(parts["qweight"].shape[0], parts["qweight"].shape[1] * 8, group_size, "bias" in parts)
        lin.load_state_dict(parts)
        out[i] = lin
    return out


def remove_work(work: Path) -> None:
    shutil.rmtree(work, ignore_errors=True)
