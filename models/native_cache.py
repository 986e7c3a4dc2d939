"""The native step's repacked INT4 weights, cached in the Parley cache and read back on later starts.

Repacking an INT4 model for the CPU step (`kernels.native.pack_q4` / `pack_q8`) takes seconds to a minute on
every start (46 s for an 8B GGUF); the result depends only on the quantized weights and the packing code, so it
is kept as `native-<key>.safetensors` with a manifest `native-<key>.json` (its size and sha256), both written
atomically (parley.cache_files), the manifest last. Where (`Place`): an AWQ folder of the Parley cache keeps its
own; a GGUF run on its own 4-bit weights gets a folder under `gguf-layouts/`. The key hashes the weights'
identity (the AWQ folder's manifest; the GGUF's sha256 or hub revision), the head's bit width and the source of
the packing and reading code, so a rebuilt model, a file changed in place or changed code never reads a stale
file; saving removes the place's older layout of the same variant. The Parley cache folder is treated as
untrusted-ish: a file whose size, hash or tensor shapes do not match what the model implies is ignored (and
rebuilt), never read past. A user's own folders are never written to.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..cache_files import Cancelled, cache_dir, remove_orphans, save_safetensors_atomic, write_json_atomic

if TYPE_CHECKING:
    from .resolve import ModelFiles

log = logging.getLogger(__name__)

FORMAT = "parley-native-pack-1"
CHUNK = 16 << 20  # bytes read (and hashed) at a time


class Stale(ValueError):
    """A cached tensor whose shape or dtype is not the one the model implies."""

_DTYPES = {"U8": torch.uint8, "I16": torch.int16, "F32": torch.float32}


@dataclass(frozen=True)
class Place:
    """Where a model's packed layout is cached, and what it is packed from."""

    folder: Path
    weights: str  # the weights' identity (a hash): another file or revision is another key
    rotation: str | None = None  # the rotated down_proj's identity, where the folder has one
    readers: tuple[Path, ...] = ()  # the code that reads the weights for the packer, beyond the packer's own


def awq_place(folder: Path) -> Place | None:
    """The place of an AWQ folder's layout, or None when `folder` is no AWQ folder of the Parley cache."""
    from .quantize import hadamard
    from .quantize.cache import MANIFEST, awq_root

    try:
        folder = folder.resolve()
        if awq_root().resolve() not in folder.parents:
            return None
        files = json.loads((folder / MANIFEST).read_text())["files"]
        rotation = files.get(hadamard.FILE, {}).get("sha256")
        return Place(folder, str(files["model.safetensors"]["sha256"]), str(rotation) if rotation else None)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


def gguf_root() -> Path:
    """Where the layouts of GGUF files run on their own 4-bit weights (`--quant gguf`) are cached: a GGUF has
    no Parley folder of its own, and a user's own folders are never written to."""
    return cache_dir("gguf-layouts")


def gguf_place(files: ModelFiles) -> Place:
    """A GGUF's place: a folder named by where the file is (hub repo and revision, or resolved path), so a file
    changed in place has its stale layout replaced on the next save rather than kept beside the new one; its
    identity (the file's sha256, or the revision) is the weights in the key."""
    from . import gguf_int4, gguf_weights
    from .quantize.cache import source_identity

    ident = source_identity(files)
    where = {k: v for k, v in ident.items() if k in ("repo_id", "revision", "path")}
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(files.path).stem).strip("-.")[:60] or "model"
    folder = gguf_root() / f"{name}-{_digest(where)}"
    return Place(folder, _digest(ident), readers=(Path(gguf_int4.__file__), Path(gguf_weights.__file__)))


def place_of(files: ModelFiles, int4_gguf: bool = False) -> Place | None:
    """Where the layout of a model loaded from `files` is cached: an AWQ folder of the Parley cache, or a GGUF
    run on its own 4-bit weights (`int4_gguf`); None for anything else (a user's folder, an fp model)."""
    if files.kind == "dir":
        return awq_place(Path(files.path))
    return gguf_place(files) if int4_gguf else None


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def variant(head_bits: int, head: str = "", rotated_down: bool = False) -> str:
    """What a place may hold one layout of: each head width and rounding, with and without the rotation."""
    return f"head{head_bits}{head}" + ("-rotated" if rotated_down else "")


def cache_key(place: Place, head_bits: int, head: str = "", rotated_down: bool = False) -> str | None:
    """The key of the packed file at `place`, or None where it cannot be cached (a rotated down_proj the folder
    does not have). `head`: how a 4-bit head is rounded ("gptq", or "" for to nearest); `rotated_down`: whether
    the model runs the folder's rotated down_proj (models/quantize/hadamard.py) rather than the standard one."""
    from ..kernels import native
    from .quantize import gptq, head4

    weights = place.weights
    if rotated_down:
        if place.rotation is None:
            return None
        weights += "|" + place.rotation
    # the packing code's sources (native_step.py read, not imported: it imports this module)
    sources = (Path(native.__file__), Path(__file__).with_name("native_step.py"), Path(head4.__file__),
               Path(gptq.__file__), *place.readers)
    code = b"".join(p.read_bytes() for p in sources)
    text = f"{FORMAT}|{weights}|{variant(head_bits, head, rotated_down)}|".encode() + hashlib.sha256(code).digest()
    return hashlib.sha256(text).hexdigest()[:16]


def _paths(folder: Path, key: str) -> tuple[Path, Path]:
    return folder / f"native-{key}.safetensors", folder / f"native-{key}.json"


def load(folder: Path, key: str) -> dict[str, Tensor] | None:
    """The packed tensors, read into one buffer as the file is hashed (a buffer torch allocates, so in
    transparent huge pages where asked: a decode pass streams these, and a file mapping's 4 KB pages cost one
    thread ~4% of its decode at 1B); None when there is no complete, intact file for `key` (the caller then
    packs and `save`s)."""
    data, manifest = _paths(folder, key)
    with _lock:
        writing = _saving.get(data)
    if writing is not None:  # this process is writing it (`save_later`): read it once written
        writing.wait()
    try:
        meta = json.loads(manifest.read_text())
        if meta.get("format") != FORMAT or meta.get("key") != key:
            raise ValueError("its manifest is for another key")
        if data.stat().st_size != meta["size"]:
            raise ValueError("its size differs from its manifest")
        return _read_safetensors(data, meta["sha256"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("ignoring the cached CPU layout %s (%s); repacking", data, e)
        return None


def _read_safetensors(path: Path, sha256: str) -> dict[str, Tensor]:
    """A safetensors file's tensors as views of one buffer holding the file, read once and checked against
    `sha256` on the way (ValueError when it differs)."""
    size = path.stat().st_size
    if size < 8:
        raise ValueError("truncated header")
    buf = torch.empty(size, dtype=torch.uint8)
    view, digest = memoryview(buf.numpy()), hashlib.sha256()
    # Each chunk is hashed on a second thread while the next is read: the read's cost is mostly the kernel
    # faulting in the fresh buffer's pages, and both calls let go of the GIL.
    with path.open("rb") as f, ThreadPoolExecutor(1) as hasher:
        at, hashed = 0, None
        while at < size:
            n = f.readinto(view[at : at + CHUNK])
            if not n:
                raise ValueError("the file is shorter than it was a moment ago")
            if hashed is not None:
                hashed.result()
            hashed = hasher.submit(digest.update, view[at : at + n])
            at += n
        if hashed is not None:
            hashed.result()
    if digest.hexdigest() != sha256:
        raise ValueError("its sha256 differs from its manifest")
    (n,) = struct.unpack("<Q", bytes(view[:8]))
    if n > size - 8:
        raise ValueError("truncated header")
    header = json.loads(bytes(view[8 : 8 + n]))
    storage = buf.untyped_storage()
    base = 8 + n
    out: dict[str, Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES[info["dtype"]]
        start, end = info["data_offsets"]
        shape = [int(d) for d in info["shape"]]
        count = 1
        for d in shape:
            count *= d
        itemsize = torch.empty((), dtype=dtype).element_size()
        if not 0 <= start <= end <= size - base or end - start != count * itemsize or (base + start) % itemsize:
            raise ValueError(f"tensor {name} lies outside the file, is misaligned or disagrees with its shape")
        out[name] = torch.empty(0, dtype=dtype).set_(storage, (base + start) // itemsize, shape)
    return out


# a layout file this process is writing -> set when its write has ended. An event, not Thread.join: a join that
# Ctrl-C interrupts marks the thread ended (CPython 3.11-3.12), and the interpreter would then exit mid-write.
_saving: dict[Path, threading.Event] = {}
_lock = threading.Lock()
_stop = threading.Event()  # set by `cancel_saves`: the writes in progress give up


def save_later(place: Place, key: str, tensors: dict[str, Tensor], variant_name: str) -> None:
    """`save` on a thread of its own: the step runs at once instead of after the write (4 GB at 8B, ~10 s on a
    VM's disk). Not a daemon: the process waits for it before it exits. A process killed meanwhile leaves a
    temporary file, which the next save into the folder removes."""
    data, _ = _paths(place.folder, key)
    ended = threading.Event()

    def run() -> None:
        try:
            save(place, key, tensors, variant_name, stop=_stop)
        except Cancelled:
            log.info("the CPU layout in %s was not cached: cancelled", place.folder)
        except Exception:  # noqa: BLE001 - the step runs either way; the next start packs again
            log.warning("could not cache the CPU layout in %s", place.folder, exc_info=True)
        finally:
            with _lock:
                _saving.pop(data, None)
            ended.set()

    with _lock:
        _saving[data] = ended
    threading.Thread(target=run, name=f"parley-layout-{key}").start()


def pending_saves() -> bool:
    """Whether a `save_later` of this process is still writing."""
    with _lock:
        return bool(_saving)


def wait_for_saves() -> None:
    """Wait until every `save_later` of this process has written its file (or given up)."""
    with _lock:
        writes = list(_saving.values())
    for ended in writes:
        ended.wait()


def cancel_saves() -> None:
    """Give up the writes in progress (nothing of them is kept; the next start packs again) and wait for them."""
    _stop.set()
    try:
        wait_for_saves()
    finally:
        _stop.clear()


def save(place: Place, key: str, tensors: dict[str, Tensor], variant_name: str,
         stop: threading.Event | None = None) -> None:
    """Write the packed tensors and then their manifest, each atomically, and then remove the place's older
    layout of the same variant (packed by other code, or from a file since changed) and what killed writers
    left; a failure only costs the next start."""
    data, manifest = _paths(place.folder, key)
    try:
        place.folder.mkdir(parents=True, exist_ok=True)
        remove_orphans(place.folder)
        sha256 = save_safetensors_atomic(data, tensors, metadata={"format": FORMAT}, stop=stop)
        write_json_atomic(manifest, {"format": FORMAT, "key": key, "variant": variant_name,
                                     "size": data.stat().st_size, "sha256": sha256})
    except OSError as e:  # a read-only or full cache: the step works, the next start packs again
        log.warning("could not cache the CPU layout in %s (%s)", place.folder, e)
        return
    for other in place.folder.glob("native-*.json"):
        if other == manifest:
            continue
        try:
            if json.loads(other.read_text()).get("variant", variant_name) != variant_name:
                continue  # another variant's (one without is older code's, whose key no start makes again)
            other.with_suffix(".safetensors").unlink(missing_ok=True)
            other.unlink()
        except (OSError, ValueError, AttributeError):  # another process's, or unreadable: left as it is
            continue
