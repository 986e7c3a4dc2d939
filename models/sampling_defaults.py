"""The sampling values a model's makers recommend, and where they come from: its generation_config.json, the
GGUF's `general.sampling.*` metadata, or (neither saying) its family's model cards, matched in its name
(`Family.recommended` in families.py). The app starts a model on these instead of one temperature for all
(SmolLM2-135M at 0.7 answers nonsense; its card uses 0.2); the user's own settings win once set."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from .families import recommended_sampling
from .resolve import ModelFiles

FIELDS = ("temperature", "top_p", "top_k", "min_p")
# GGUF keys as llama.cpp writes them (`general.sampling.temp`, ...).
GGUF_KEYS = {"temperature": "general.sampling.temp", "top_p": "general.sampling.top_p",
             "top_k": "general.sampling.top_k", "min_p": "general.sampling.min_p"}


def _valid(values: dict[str, object]) -> dict[str, float | int]:
    """Only values in the ranges the engine accepts (a downloaded file is untrusted input)."""
    ok: dict[str, float | int] = {}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if name == "temperature" and 0 <= value <= 2 or name == "top_p" and 0 < value <= 1 \
                or name == "min_p" and 0 <= value < 1:
            ok[name] = float(value)
        elif name == "top_k" and value >= 0 and float(value).is_integer():
            ok[name] = int(value)
    return ok


def general_metadata(path: Path) -> dict[str, object]:
    """A GGUF's leading `general.*` keys (where llama.cpp writes `general.sampling.*`), read up to the first
    other key: the whole header (a vocabulary of tens of thousands of strings) takes half a second."""
    from .gguf_weights import _ARRAY, _SCALARS, _STRING

    found: dict[str, object] = {}
    try:
        with open(path, "rb") as f:
            def unpack(fmt: str) -> object:
                size = struct.calcsize(fmt)
                data = f.read(size)
                if len(data) != size:
                    raise ValueError("truncated")
                return struct.unpack(fmt, data)[0]

            def string() -> str:
                n = int(unpack("<Q"))
                if n > 1 << 20:
                    raise ValueError("string too long for a metadata key")
                return f.read(n).decode("utf-8")

            def value(kind: int) -> object:
                if kind == _STRING:
                    return string()
                if kind == _ARRAY:
                    item, count = int(unpack("<I")), int(unpack("<Q"))
                    if count > 4096:
                        raise ValueError("array too long for a general key")
                    return [value(item) for _ in range(count)]
                return unpack(_SCALARS[kind])

            if f.read(4) != b"GGUF" or unpack("<I") not in (2, 3):
                return found
            _, n_kv = unpack("<Q"), int(unpack("<Q"))
            for _ in range(n_kv):
                key = string()
                if not key.startswith("general."):
                    break
                found[key] = value(int(unpack("<I")))
    except (OSError, ValueError, KeyError, UnicodeDecodeError, struct.error):
        pass  # the model's load reports a damaged file; here it only means no recommendation is known
    return found


def sampling_defaults(files: ModelFiles, name: str = "") -> tuple[dict[str, float | int], str]:
    """(values, where they come from in words); ({}, "") when nothing is known (the engine's defaults stay)."""
    path = Path(files.path)
    if files.kind == "dir" and (path / "generation_config.json").is_file():
        try:
            config = json.loads((path / "generation_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            config = None
        if isinstance(config, dict) and config.get("do_sample", True):
            values = _valid({k: config.get(k) for k in FIELDS if k in config})
            if values:
                return values, "from the model's generation_config.json"
    names = [name, files.ref, files.repo_id or "", path.name]
    if files.kind == "gguf":
        metadata = general_metadata(path)
        values = _valid({k: metadata.get(key) for k, key in GGUF_KEYS.items() if key in metadata})
        if values:
            return values, "from the GGUF's metadata"
        names += [str(metadata.get("general.basename", "")), str(metadata.get("general.name", ""))]
    text = " ".join(names).lower()
    for pattern, source, values in recommended_sampling():
        if re.search(pattern, text):
            return dict(values), f"from {source}"
    return {}, ""
