"""The Parley cache of AWQ-quantized models: quantize on first use, load in seconds afterwards.

One folder per (source model + revision or content fingerprint, quantization settings), under
`$PARLEY_CACHE_DIR/awq/` (default: the platform's user cache dir). A folder is built in a temporary
sibling and `os.replace`d into place only when complete, and its `manifest.json` -- written last, holding
the source, settings, calibration, timing and every file's size and sha256 -- is verified before each
use. A folder that does not verify (killed build, truncated or edited file, other settings) is never
used: it is rebuilt, and the log says why.

What each method runs and its name in the key are methods.py's; the cache root, hashing and the atomic writes
are parley.cache_files'.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from ...cache_files import CACHE_ENV, cache_dir, file_sha256, fsync_folder, pid_running, replace_folder
from ..errors import ModelLoadError
from ..progress import Progress, ProgressFn
from ..resolve import ModelFiles
from . import hadamard
from .calibration import calibration_key, load_calibration
from .checkpoint import is_awq, save_awq
from .methods import DISTILL_SAMPLES, calibration_size, fast_cpu_bf16, method_name, tier_settings
from .tiers import TIERS, choose_tier

log = logging.getLogger("parley.quantize")

# Bump when the algorithm or the folder format changes: older folders stop matching.
# 3: the rotary frequencies of a GGUF's `rope_freqs` are stored in the folder.
# 4: o_proj quantized under grouped-query attention too. 5: the method is part of the key (methods.method_name).
# The key stopped holding the source's `ref` (how it was named) after format 5: such a folder is rebuilt once.
FORMAT_VERSION = 5
MANIFEST = "manifest.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                   "generation_config.json", "vocab.json", "merges.txt", "added_tokens.json")


def awq_root() -> Path:
    """The folder of the quantized models: `awq/` in the Parley cache (cache_files.py)."""
    return cache_dir("awq")


def source_identity(files: ModelFiles) -> dict[str, Any]:
    """What the quantized folder was made from: hub repo + commit, or a fingerprint of local files
    (a GGUF's sha256; for a directory, its files' names, sizes and modification times). Never the name it
    was asked for by (`ref`: "the embedded model", a path typed in the model picker): every route to the same
    weights finds the same folder."""
    ident: dict[str, Any] = {"kind": files.kind}
    if files.repo_id and files.revision:
        ident.update(repo_id=files.repo_id, revision=files.revision)
    elif files.kind == "gguf":
        ident.update(path=str(Path(files.path).resolve()), sha256=file_sha256(Path(files.path)))
    else:
        entries = sorted(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}"
                         for p in Path(files.path).iterdir() if p.is_file())
        ident.update(path=str(Path(files.path).resolve()),
                     files_fingerprint=hashlib.sha256("\n".join(entries).encode()).hexdigest())
    return ident


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:60] or "model"


def folder_for(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    src = key["source"]
    name = src.get("repo_id") or Path(src.get("path", "model")).stem
    return awq_root() / f"{_slug(name)}-awq-g{key['settings']['group_size']}-{digest}"


def verify(folder: Path, key: dict[str, Any]) -> str | None:
    """None when `folder` is a complete build for `key`; otherwise why it is not."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return "no manifest (an interrupted build?)"
    except (OSError, ValueError, RecursionError) as e:
        return f"unreadable manifest ({type(e).__name__})"
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files") or {}, dict):
        return "its manifest is not a JSON object of files"
    if manifest.get("key") != key:
        return "its manifest records another source or other settings"
    listed = manifest.get("files") or {}
    for required in ("config.json", "model.safetensors"):
        if required not in listed:
            return f"the manifest lists no {required}"
    for name, meta in listed.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != meta.get("size"):
            return f"{name} has {path.stat().st_size} bytes, the manifest says {meta.get('size')}"
        if file_sha256(path) != meta.get("sha256"):
            return f"{name} does not match its sha256 in the manifest"
    return None


def clean_stale(root: Path) -> None:
    """Remove temporary build folders whose builder process is gone (killed or crashed).

    Called at the start of every `ensure_quantized`, so a killed build's leftovers (up to the model's
    size) go on the next load, not only on the next build of the same settings.
    """
    if not root.is_dir():
        return
    for p in root.glob(".tmp-*"):
        m = re.search(r"\.pid(\d+)\.", p.name)
        if m and not pid_running(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True)


def tokenizer_files(files: ModelFiles, out: Path) -> list[Path]:
    """The source's tokenizer files; for a GGUF, a tokenizer.json and tokenizer_config.json written to `out`."""
    if files.kind == "dir":
        return [Path(files.path) / n for n in TOKENIZER_FILES if (Path(files.path) / n).is_file()]
    from ..tokenizer import load_tokenizer

    tok = load_tokenizer(files)
    hf = getattr(tok.backend, "tok", None)
    if hf is None:
        log.warning("%s: tokenizer cannot be written as tokenizer.json; the AWQ folder has none", files.path)
        return []
    out.mkdir(parents=True, exist_ok=True)
    hf.save(str(out / "tokenizer.json"))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", **tok.special_tokens,
                              "add_bos_token": tok.add_bos}
    if tok.has_chat_template:
        config["chat_template"] = tok.chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return [out / "tokenizer.json", out / "tokenizer_config.json"]


def ensure_quantized(files: ModelFiles, *, group_size: int = 128, calib: str | list[str] | None = None,
                     n_samples: int | None = None, seq_len: int | None = None,
                     progress: ProgressFn | None = None, device: torch.device | str | None = None,
                     rebuild: bool = False, method: str | None = None) -> ModelFiles:
    """The AWQ folder for `files` in the Parley cache, quantizing (atomically) when there is no valid one.

    `method`: a tier of `TIERS`, or None / "auto" for `choose_tier`'s. A source that already is an AWQ
    checkpoint is returned as it is.
    """
    from ..loading import load_config

    clean_stale(awq_root())
    config = load_config(files)
    if files.kind == "dir" and is_awq(config.quantization):
        return files
    device = torch.device(device) if device is not None else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    auto = method in (None, "auto")
    tier = choose_tier(config, device.type, fast_cpu_bf16()) if auto else str(method)
    source = source_identity(files)

    def key_for(tier: str) -> dict[str, Any]:
        default_n, default_len = calibration_size(tier, device) if tier in TIERS else (0, 0)
        settings = {"format": FORMAT_VERSION, "method": method_name(tier_settings(tier, group_size, device)),
                    "bits": 4, "group_size": group_size,
                    "calib": calibration_key(calib), "n_samples": n_samples or default_n,
                    "seq_len": seq_len or default_len}
        return {"source": source, "settings": settings}

    key = key_for(tier)
    folder = folder_for(key)
    if auto and not rebuild and not (folder.exists() and verify(folder, key) is None):
        # A folder the user made with `parley quantize --method ...` serves a first run: the best one there is.
        for other in (t for t in TIERS if t != tier):
            other_key = key_for(other)
            if folder_for(other_key).exists() and verify(folder_for(other_key), other_key) is None:
                key, folder, tier = other_key, folder_for(other_key), other
                break
    result = ModelFiles(ref=f"{files.ref} (AWQ INT4)", kind="dir", path=folder, repo_id=files.repo_id,
                        revision=files.revision, verified=True)  # `verify` passed: its values were checked
    if folder.exists() and not rebuild and verify(folder, key) is None:
        return result
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with _one_builder(folder, progress):  # another process may have built it while we waited
            if folder.exists() and not rebuild:
                why = verify(folder, key)
                if why is None:
                    return result
                log.warning("cached AWQ model %s is not usable: %s; rebuilding it", folder, why)
                if progress:
                    progress(Progress("quantize", 0, 0, "layer", f"cached model unusable ({why}); rebuilding"))
            if progress:  # said before the slow part, so a caller can carry on with something else meanwhile
                progress(Progress("quantize", 0, 0, "layer", "starting AWQ quantization"))
            build(files, key, folder, calib, progress, device, tier)
    except (OSError, SafetensorError) as e:
        code, why = _write_error(e)
        if code not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
            raise
        from .stream import work_folder

        work = work_folder(folder)
        kept = sum(p.stat().st_size for p in work.iterdir() if p.is_file()) if work.is_dir() else 0
        resume = (f"; the layers already done ({kept / 1e6:.0f} MB in {work}) are kept for the next run to resume "
                  "from, delete that folder to free their space") if kept else ""
        raise ModelLoadError(
            f"{folder.parent}: cannot write the quantized model ({why}); free some space or make it "
            f"writable, or set {CACHE_ENV} to a folder on another disk (nothing partial was kept{resume})"
        ) from None
    return dataclasses.replace(result, verified=False)  # just built: loading checks its values once


def _write_error(e: OSError | SafetensorError) -> tuple[int | None, str]:
    """(errno, its text) of a failed write; safetensors reports one as `IoError(Os { code: 28, ... })`."""
    if isinstance(e, OSError):
        return e.errno, e.strerror or str(e)
    found = re.search(r"code: (\d+)", str(e))
    code = int(found.group(1)) if found else None
    return code, os.strerror(code) if code is not None else str(e)


_BUILDING: list[str] = []  # the folders this process holds the build lock for (what another thread waits for)


@contextmanager
def _one_builder(folder: Path, progress: ProgressFn | None) -> Iterator[None]:
    """Hold the cache's build lock: two Parleys started at once on a first run quantize once, the second
    waiting for the first's folder. An advisory lock on the cache folder itself (no lock file to leave
    behind), released by the kernel if its holder is killed."""
    try:
        import fcntl
    except ImportError:  # not POSIX: builds stay atomic, they may just run twice
        yield
        return
    fd = os.open(folder.parent, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:  # the lock is per open file, so a build on another thread of ours holds it too
                ours = next(iter(_BUILDING), None)
                what = f"this Parley's INT4 build of {ours}" if ours else "another Parley's INT4 build"
                progress(Progress("quantize", 0, 0, "layer", f"waiting for {what} to finish"))
            fcntl.flock(fd, fcntl.LOCK_EX)
        _BUILDING.append(folder.name.rsplit("-awq-", 1)[0])
        try:
            yield
        finally:
            _BUILDING.remove(folder.name.rsplit("-awq-", 1)[0])
    finally:
        os.close(fd)  # releases the lock


def build(files: ModelFiles, key: dict[str, Any], folder: Path, calib: str | list[str] | None,
          progress: ProgressFn | None, device: torch.device, tier: str = "full") -> None:
    """Quantize layer by layer (stream.py: resumable, the fp model never whole), assemble the folder in a
    temporary sibling of `folder`, write the manifest last, then rename it into place."""
    from ..loading import assemble, load_config
    from ..tokenizer import load_tokenizer
    from . import stream
    from .awq import AWQReport, distill_model

    settings = key["settings"]
    start = time.monotonic()
    config = load_config(files)
    awq = tier_settings(tier, settings["group_size"], device)
    n = settings["n_samples"]
    calibrated = awq.awq_scales or awq.clip or awq.gptq or awq.refit_scales
    if calibrated:
        tok = load_tokenizer(files)
        calibration = load_calibration(tok.encode, n * (DISTILL_SAMPLES if awq.distill else 1), settings["seq_len"],
                                       calib)
        tokens, description = calibration.tokens, calibration.description
    else:  # round to nearest: the walk runs no layer, one dummy sequence keeps its shapes
        tokens, description = torch.zeros(1, 1, dtype=torch.long), "none (round to nearest)"
    rows = torch.linspace(0, len(tokens) - 1, n).round().long() if len(tokens) > n else torch.arange(len(tokens))
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    work = stream.work_folder(folder)
    t0 = time.monotonic()
    walk = stream.quantize_layers(files, config, key, work, awq, tokens, rows, device, dtype,
                                  top_k=awq.distill.top_k if awq.distill else 0, progress=progress,
                                  calibrated=calibrated)
    # The finished model, from the work folder's files: in fp16 unless it is distilled here (fp32 on a CPU).
    model = assemble(walk.config, stream.quantized_weights(work, config.n_layers),
                     dtype if awq.distill else torch.float16, "cpu", str(work), walk.group_size)
    report = AWQReport(group_size=walk.group_size, requested_group_size=settings["group_size"], rotated=walk.rotated,
                       rotated_down=stream.rotated_downs(work, config.n_layers, walk.group_size),
                       down_block=walk.down_block)
    if report.rotated_down:
        report.down_diag = hadamard.rotation_diag(config.intermediate_size, walk.down_block, awq.hadamard_seed)
    if awq.distill and walk.targets is not None:
        if progress:
            progress(Progress("quantize", 0, 0, "step", "distilling the scales: starting"))
        with torch.enable_grad():
            report.distill = distill_model(model, report, tokens.to(device), walk.targets, awq, device, progress)
    quantize_s = time.monotonic() - t0
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{folder.name}.pid{os.getpid()}.", dir=folder.parent))
    try:
        save_awq(model, model.config, tokenizer_files(files, tmp / ".tokenizer"), tmp)
        del model
        if report.rotated_down:
            hadamard.save(tmp, report.rotated_down, report.down_diag, report.down_block)
        shutil.rmtree(tmp / ".tokenizer", ignore_errors=True)
        manifest = {
            "key": key,
            "source": key["source"],
            "settings": {**settings, "tier": tier, "tier_summary": TIERS.get(tier, ""),
                         "group_size_used": report.group_size,
                         "group_size_note": _group_note(report.requested_group_size, report.group_size),
                         "search_dtype": str(awq.search_dtype or dtype).removeprefix("torch."),
                         "search_samples": awq.search_samples, "n_grid": awq.n_grid,
                         "duo_scaling": awq.duo_scaling, "clip": awq.clip, "clip_qk": awq.clip_qk,
                         "rotated": report.rotated,
                         "gptq": awq.gptq, "act_order": awq.act_order, "refit_scales": awq.refit_scales,
                         "hadamard_down_block": report.down_block,
                         "distill": report.distill and {**dataclasses.asdict(awq.distill),
                                                        **dataclasses.asdict(report.distill)}},
            "calibration": description,
            "timing": {"quantize_s": round(quantize_s, 1), "total_s": round(time.monotonic() - start, 1),
                       "layers_s": round(walk.seconds, 1), "resumed_after_layer": walk.resumed_from,
                       "device": str(device), "threads": torch.get_num_threads()},
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "files": {p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)}
                      for p in sorted(tmp.iterdir()) if p.is_file()},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        fsync_folder(tmp)
        replace_folder(tmp, folder)  # an invalid build there is moved aside first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    stream.remove_work(work)  # only once the folder is in place: until then a new start resumes from it


def _group_note(requested: int, used: int) -> str:
    if requested == used:
        return ""
    return (f"group size {requested} does not divide every layer's input size; {used} is used for all "
            "layers so the single quantization_config group_size describes the checkpoint")

