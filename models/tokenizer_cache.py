"""A GGUF's rebuilt tokenizer kept in the Parley cache, so later starts read it instead of rebuilding it.

Rebuilding Gemma 3's 262,144-token SentencePiece vocabulary from GGUF metadata (every split of every token
tried as a merge) took ~2.5 s of CPU on every launch, ~15 s of wall time on a busy machine; reading the
built `tokenizers` JSON back takes about a third of that. The file is `<cache>/tokenizers/<name>-<key>.json`,
keyed by the GGUF's resolved path, size and modification time and the source of the code that builds it
(a changed file or builder never reads a stale one). It holds the tokenizer's JSON with its sha256, written
to a temporary name and renamed into place. The cache is untrusted: a file that does not parse, whose hash
does not match or that `tokenizers` refuses is ignored and rebuilt (the log says why), never a crash.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer

from ..cache_files import cache_dir, write_json_atomic

log = logging.getLogger(__name__)

FORMAT = "parley-gguf-tokenizer-1"


def cache_path(gguf: Path) -> Path | None:
    """Where `gguf`'s built tokenizer is cached; None when the file cannot be stat'ed."""
    from . import gguf_tokenizer

    try:
        gguf = gguf.resolve()
        st = gguf.stat()
        code = Path(gguf_tokenizer.__file__).read_bytes()
    except OSError:
        return None
    ident = f"{FORMAT}|{gguf}|{st.st_size}|{st.st_mtime_ns}|".encode() + hashlib.sha256(code).digest()
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", gguf.stem).strip("-.")[:60] or "model"
    return cache_dir("tokenizers") / f"{name}-{hashlib.sha256(ident).hexdigest()[:16]}.json"


def load_or_build(gguf: Path, build: Callable[[], Tokenizer]) -> Tokenizer:
    """The cached tokenizer of `gguf` when intact, else `build()`'s (then cached for the next start)."""
    path = cache_path(Path(gguf))
    if path is not None:
        tok = _read(path)
        if tok is not None:
            return tok
    tok = build()
    if path is not None:
        _write(path, tok)
    return tok


def _read(path: Path) -> Tokenizer | None:
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        text = entry["tokenizer"]
        if entry.get("format") != FORMAT or not isinstance(text, str):
            raise ValueError("not a Parley tokenizer cache entry")
        if hashlib.sha256(text.encode()).hexdigest() != entry.get("sha256"):
            raise ValueError("its sha256 differs from the one recorded")
        return Tokenizer.from_str(text)
    except FileNotFoundError:
        return None
    except Exception as e:  # bad JSON or UTF-8, a missing key, or what `tokenizers` (Rust) refuses
        log.warning("ignoring the cached tokenizer %s (%s); rebuilding it", path, e)
        return None


def _write(path: Path, tok: Tokenizer) -> None:
    """Atomically (temporary name, then rename); a failure only costs the next start a rebuild."""
    text = tok.to_str()
    entry = {"format": FORMAT, "sha256": hashlib.sha256(text.encode()).hexdigest(), "tokenizer": text}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, entry)
    except OSError as e:  # a read-only or full cache
        log.warning("could not cache the tokenizer in %s (%s)", path.parent, e)
