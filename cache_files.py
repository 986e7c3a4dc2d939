"""Where Parley keeps what it computes once, and how a file gets there whole.

The Parley cache is one folder: `$PARLEY_CACHE_DIR`, else the platform's user cache folder (platformdirs), with a
subfolder per kind of thing (`awq/` the quantized models, `native/` the CPU library, `tokenizers/` rebuilt GGUF
tokenizers, `random/` the benches' random checkpoints). Every file in it (and the app's settings file) is
written the same way: under a temporary name in the same folder, flushed to disk, then renamed over the real
name, so a crash or a full disk leaves the old file or the new one, never half of one. Readers check what they
read against a sha256 recorded beside it (`file_sha256`).

Below every layer (kernels/ may import it): no torch, no model knowledge.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

CACHE_ENV = "PARLEY_CACHE_DIR"


def cache_root() -> Path:
    """The Parley cache folder: $PARLEY_CACHE_DIR, else the platform's user cache folder for parley."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("parley"))


def cache_dir(kind: str) -> Path:
    """The cache's folder for one kind of file (`awq`, `native`, `tokenizers`, `random`); not created here."""
    return cache_root() / kind


def file_sha256(path: Path | str) -> str:
    """The hex sha256 of a file's bytes, read a megabyte at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync(path: Path | str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_folder(folder: Path) -> None:
    """Flush a folder's files and its own entry, so a crash after renaming it cannot leave empty files."""
    for p in folder.iterdir():
        if p.is_file():
            _fsync(p)
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        path.unlink(missing_ok=True)


def replace_folder(complete: Path, folder: Path) -> None:
    """Rename the finished folder `complete` to `folder`; one already there is first moved aside (under a
    `.tmp-trash-...pid<N>.` name, which a later clean-up removes if this process dies) and then deleted."""
    if folder.exists():
        trash = folder.with_name(f".tmp-trash-{folder.name}.pid{os.getpid()}.{uuid.uuid4().hex[:8]}")
        os.replace(folder, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(complete, folder)


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary name beside `path` for a writer that makes the file or folder itself (a compiler, a GGUF writer,
    a folder of shards): when the block ends it is flushed and renamed to `path` (a folder replacing the one
    there); when the block raises, or leaves nothing there, it is removed and `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.pid{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        if tmp.is_dir():
            fsync_folder(tmp)
            replace_folder(tmp, path)
        elif tmp.exists():
            _fsync(tmp)
            os.replace(tmp, path)
    finally:
        _remove(tmp)


def remove_orphans(folder: Path) -> None:
    """Remove what killed writers left in `folder`: `replacing`'s temporary files (`.NAME.pid<N>.XXXXXXXX.tmp`)
    whose process N no longer runs (a killed first start's would otherwise keep gigabytes forever)."""
    for p in Path(folder).glob(".*.pid*.tmp"):
        m = re.search(r"\.pid(\d+)\.[0-9a-f]{8}\.tmp$", p.name)
        if m and not pid_running(int(m.group(1))):
            _remove(p)


def pid_running(pid: int) -> bool:
    """Whether process `pid` runs (a temporary file or folder named for it may still be in use)."""
    if os.name == "nt":  # signal 0 is CTRL_C_EVENT there: never sent to ask
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it runs, as another user
        return True
    return True


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole or not at all (temporary name, fsync, rename)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text_atomic(path: Path, text: str) -> None:
    """`write_bytes_atomic` of `text` in UTF-8."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, value: Any, *, indent: int | None = None, sort_keys: bool = False) -> None:
    """`value` as JSON (and a newline), written whole or not at all."""
    write_text_atomic(path, json.dumps(value, indent=indent, sort_keys=sort_keys) + "\n")


# safetensors' names for the dtypes a cache file holds (a tensor of another dtype goes through the library)
_SAFETENSORS_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                       "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


class Cancelled(Exception):
    """A write given up on purpose (its `stop` was set): nothing of it is kept."""


def save_safetensors_atomic(path: Path, tensors: dict[str, Tensor], metadata: dict[str, str] | None = None,
                            stop: threading.Event | None = None) -> str:
    """Write tensors (detached, contiguous, on the CPU) as a safetensors file, whole or not at all; its sha256.

    Written here, not by `safetensors.torch.save_file`: that one copies every tensor into bytes first, and the
    file would then be read back for its hash. Here each tensor's own memory goes to the file and is hashed on a
    second thread meanwhile (an 8B model's 4.7 GB CPU layout: 10.6 s against 13.5, nearly all of it the page
    cache's writes on a VM). The format is the library's (tests/test_cache_files_atomic.py reads it with
    `safetensors`); other dtypes go through `save_file`. `stop`, when set, ends the write between pieces
    (Cancelled)."""
    import torch

    flat = {k: v.detach().cpu().contiguous().reshape(-1) for k, v in tensors.items()}
    names = {k: str(v.dtype).removeprefix("torch.") for k, v in flat.items()}
    if any(n not in _SAFETENSORS_DTYPES for n in names.values()):
        from safetensors.torch import save_file

        with replacing(path) as tmp:
            save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=metadata)
        return file_sha256(path)
    # widest items first, so every tensor starts at a multiple of its item size with no gap between them
    order = sorted(flat, key=lambda k: (-flat[k].element_size(), k))
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for k in order:
        size = flat[k].numel() * flat[k].element_size()
        header[k] = {"dtype": _SAFETENSORS_DTYPES[names[k]], "shape": list(tensors[k].shape),
                     "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    h, chunks = hashlib.sha256(), [len(text).to_bytes(8, "little") + text] + [
        piece for k in order for piece in _pieces(memoryview(flat[k].view(torch.uint8).numpy()), 1 << 24)]
    # hashed on a thread of its own (hashlib lets go of the GIL) while the same pieces are written: a plain
    # thread, as this runs on the layout's writing thread, where an executor is refused once the process exits
    hashing = threading.Thread(target=lambda: [h.update(c) for c in chunks if not (stop and stop.is_set())],
                               name="parley-hash")
    hashing.start()
    try:
        with replacing(path) as tmp, open(tmp, "wb") as f:
            for chunk in chunks:
                if stop is not None and stop.is_set():
                    raise Cancelled(str(path))
                f.write(chunk)
    finally:
        hashing.join()
    return h.hexdigest()


def _pieces(view: memoryview, size: int) -> Iterator[memoryview]:
    for start in range(0, len(view), size):
        yield view[start:start + size]
