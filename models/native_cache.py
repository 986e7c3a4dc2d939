"""The native step's repacked INT4 weights, cached next to the quantized model and read back on later starts.

Repacking an INT4 model for the CPU step (`kernels.native.pack_q4` / `pack_q8`) took seconds on every start;
the result depends only on the quantized weights and the packing code, so it is kept in the AWQ folder as
`native-<key>.safetensors` with a manifest `native-<key>.json` (its size and sha256), both written atomically
(parley.cache_files), the manifest last. The key hashes the folder's own manifest (its weights' sha256), the
head's bit width and the source of the packing code, so a rebuilt model or changed packing code never reads a
stale file. The Parley cache folder is treated as untrusted-ish: a file whose
size, hash or tensor shapes do not match what the model implies is ignored (and rebuilt), never read past.
Only folders inside the Parley cache get a packed file: a user's own AWQ checkpoint folder is not written to.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
from pathlib import Path

import torch
from torch import Tensor

from ..cache_files import save_safetensors_atomic, write_json_atomic

log = logging.getLogger(__name__)

FORMAT = "parley-native-pack-1"
CHUNK = 16 << 20  # bytes read (and hashed) at a time


class Stale(ValueError):
    """A cached tensor whose shape or dtype is not the one the model implies."""

_DTYPES = {"U8": torch.uint8, "I16": torch.int16, "F32": torch.float32}


def cache_key(folder: Path, head_bits: int, head: str = "", rotated_down: bool = False) -> str | None:
    """The key of `folder`'s packed file, or None when `folder` is no AWQ folder of the Parley cache.
    `head`: how a 4-bit head is rounded ("gptq", or "" for to nearest); `rotated_down`: whether the model
    runs the folder's rotated down_proj (models/quantize/hadamard.py) rather than the standard one."""
    from ..kernels import native
    from .quantize import gptq, hadamard, head4
    from .quantize.cache import MANIFEST, awq_root

    try:
        folder = folder.resolve()
        if awq_root().resolve() not in folder.parents:
            return None
        files = json.loads((folder / MANIFEST).read_text())["files"]
        weights = files["model.safetensors"]["sha256"]
        if rotated_down:
            weights += "|" + files[hadamard.FILE]["sha256"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    # the packing code's sources (native_step.py read, not imported: it imports this module)
    sources = (Path(native.__file__), Path(__file__).with_name("native_step.py"), Path(head4.__file__),
               Path(gptq.__file__))
    code = b"".join(p.read_bytes() for p in sources)
    text = f"{FORMAT}|{weights}|{head_bits}{head}|".encode() + hashlib.sha256(code).digest()
    return hashlib.sha256(text).hexdigest()[:16]


def _paths(folder: Path, key: str) -> tuple[Path, Path]:
    return folder / f"native-{key}.safetensors", folder / f"native-{key}.json"


def load(folder: Path, key: str) -> dict[str, Tensor] | None:
    """The packed tensors, read into one buffer as the file is hashed (a buffer torch allocates, so in
    transparent huge pages where asked: a decode pass streams these, and a file mapping's 4 KB pages cost one
    thread ~4% of its decode at 1B); None when there is no complete, intact file for `key` (the caller then
    packs and `save`s)."""
    data, manifest = _paths(folder, key)
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
    with path.open("rb") as f:
        at = 0
        while at < size:
            n = f.readinto(view[at : at + CHUNK])
            if not n:
                raise ValueError("the file is shorter than it was a moment ago")
            digest.update(view[at : at + n])
            at += n
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


def save(folder: Path, key: str, tensors: dict[str, Tensor]) -> None:
    """Write the packed tensors and then their manifest, each atomically; a failure only costs the next start."""
    data, manifest = _paths(folder, key)
    try:
        sha256 = save_safetensors_atomic(data, tensors, metadata={"format": FORMAT})
        write_json_atomic(manifest, {"format": FORMAT, "key": key, "size": data.stat().st_size, "sha256": sha256})
    except OSError as e:  # a read-only or full cache: the step works, the next start packs again
        log.warning("could not cache the CPU layout in %s (%s)", folder, e)
