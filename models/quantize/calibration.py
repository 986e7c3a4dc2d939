"""Calibration text for AWQ: the activations it is run on decide which input channels count as salient.

Sources, by `calib`:
- "pile": the AWQ paper's calibration set (`mit-han-lab/pile-val-backup`, through huggingface_hub);
- "builtin": the offline corpus shipped in `assets/calibration/` (prose, code, dialogue; see its README);
- a list of local text files;
- None / "auto": pile-val when the hub can be reached, else the built-in corpus.
"""

from __future__ import annotations

import io
import json
import logging
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
from torch import Tensor

log = logging.getLogger("parley.quantize")

ASSETS = Path(__file__).resolve().parents[2] / "assets"
BUILTIN_DIR = ASSETS / "calibration"
PILE_REPO, PILE_FILE = "mit-han-lab/pile-val-backup", "val.jsonl.zst"

Encode = Callable[[str], list[int]]


@dataclass
class Calibration:
    tokens: Tensor  # [n_samples, seq_len] int64
    description: str  # what the manifest records: source, sample count and length


def builtin_files() -> list[Path]:
    return sorted(BUILTIN_DIR.glob("*.txt"))


def calibration_key(calib: str | Sequence[str | Path] | None) -> str:
    """What identifies the requested calibration in a cache key (files by name, size and mtime)."""
    if calib is None or isinstance(calib, str):
        return calib or "auto"
    parts = []
    for f in calib:
        st = Path(f).stat()
        parts.append(f"{Path(f).resolve()}:{st.st_size}:{st.st_mtime_ns}")
    return "files:" + ",".join(parts)


def load_calibration(encode: Encode, n_samples: int, seq_len: int,
                     calib: str | Sequence[str | Path] | None = None) -> Calibration:
    """`n_samples` token sequences of `seq_len` from the requested source."""
    if calib is None or calib == "auto":
        try:
            return pile_val(encode, n_samples, seq_len, probe=True)
        except Exception as e:  # offline, blocked, or zstandard missing: the shipped corpus instead
            log.warning("pile-val calibration set unavailable (%s); using the built-in corpus", _short(e))
            calib = "builtin"
    if calib == "pile":
        return pile_val(encode, n_samples, seq_len)
    if calib == "builtin":
        return from_texts(encode, n_samples, seq_len, builtin_files(), "built-in corpus assets/calibration")
    files = [Path(f) for f in calib]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"calibration files not found: {', '.join(missing)}")
    return from_texts(encode, n_samples, seq_len, files, "files " + ", ".join(f.name for f in files))


def _short(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160]}" if str(e) else type(e).__name__


def from_texts(encode: Encode, n_samples: int, seq_len: int, files: Sequence[Path], what: str) -> Calibration:
    """Samples at evenly spaced offsets of the files' concatenated tokens, so every file contributes.

    With fewer tokens than n_samples * seq_len the samples overlap (said in the description).
    """
    if not files:
        raise ValueError(f"no calibration text in {what}")
    stream: list[int] = []
    for f in files:
        stream += encode(f.read_text(encoding="utf-8", errors="replace").strip() + "\n\n")
    if len(stream) < seq_len:
        raise ValueError(f"{what}: {len(stream)} tokens, fewer than one sample of {seq_len}")
    ids = torch.tensor(stream, dtype=torch.long)
    last = len(stream) - seq_len
    starts = torch.linspace(0, last, n_samples).round().long() if n_samples > 1 else torch.zeros(1).long()
    tokens = torch.stack([ids[s: s + seq_len] for s in starts.tolist()])
    overlap = " (overlapping)" if len(stream) < n_samples * seq_len else ""
    return Calibration(tokens, f"{what}: {n_samples} x {seq_len} tokens{overlap} from {len(stream)}")


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the hub cannot be reached (one TCP connect, no retries), or None when it can or a proxy decides.

    huggingface_hub retries a failed request with backoff, ~23 s in all: without this check an offline
    first run waited that long before falling back to the built-in corpus.
    """
    from urllib.request import getproxies

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    if not url.hostname or getproxies().get(url.scheme or "https"):
        return None
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
    except OSError as e:
        return f"{url.scheme}://{url.hostname}:{port} unreachable ({e.strerror or type(e).__name__})"
    return None


def pile_val(encode: Encode, n_samples: int, seq_len: int, probe: bool = False) -> Calibration:
    """The AWQ calibration recipe: pile-val documents no longer than `seq_len` tokens, concatenated and cut
    into `n_samples` blocks of `seq_len`. Documents are taken in file order (AutoAWQ shuffles the whole
    set with seed 42 first, which needs all of it decoded); the file is fetched once into the HF cache.
    `probe`: give up at once (ConnectionError) when the file is not cached and the hub is unreachable."""
    # Offline, a copy already in the Hugging Face cache still serves.
    local_only = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    import zstandard  # not a dependency: without it this source is skipped
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    cached = try_to_load_from_cache(PILE_REPO, PILE_FILE, repo_type="dataset")
    if probe and not local_only and not isinstance(cached, str) and (why := hub_unreachable()):
        raise ConnectionError(why)
    path = hf_hub_download(PILE_REPO, PILE_FILE, repo_type="dataset", local_files_only=local_only)
    stream: list[int] = []
    with open(path, "rb") as raw:
        reader = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(raw), encoding="utf-8")
        for line in reader:
            text = json.loads(line).get("text", "").strip()
            ids = encode(text) if text else []
            if 0 < len(ids) <= seq_len:
                stream += ids
            if len(stream) >= n_samples * seq_len:
                break
    if len(stream) < n_samples * seq_len:
        raise ValueError(f"pile-val gave {len(stream)} tokens, fewer than {n_samples} x {seq_len}")
    tokens = torch.tensor(stream[: n_samples * seq_len], dtype=torch.long).view(n_samples, seq_len)
    return Calibration(tokens, f"pile-val ({PILE_REPO}): {n_samples} x {seq_len} tokens")
