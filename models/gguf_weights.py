"""Reading a GGUF file: its metadata as plain values, its tensors dequantized under Hugging Face names.

llama.cpp's converter renames every tensor (`blk.3.attn_q.weight` for `model.layers.3.self_attn.q_proj.weight`)
and, for the llama family, permutes the rows of q/k so that its rotary kernel can rotate adjacent pairs.
Our Transformer rotates halves, as Hugging Face does, so those rows are permuted back here. Where a family's
names or rows differ is in families.py (`gguf_names`, `gguf_permuted_qk`).
"""

from __future__ import annotations

import contextlib
import math
import mmap
import re
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf
import numpy as np
import torch

from .errors import ModelLoadError
from .families import family

if TYPE_CHECKING:
    from .gguf_int4 import Imported

# GGUF tensor name (after `blk.N.`) -> our parameter name (after `layers.N.`); a family's `gguf_names` override.
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # PyTorch order ([out, in]); GGUF lists dimensions the other way round
    kind: gguf.GGMLQuantizationType
    data: np.ndarray  # raw bytes, [*shape[:-1], bytes per row], mapped from the file


@dataclass(frozen=True)
class GGUFFile:
    """A GGUF file's metadata as plain Python values and its tensors as memory-mapped bytes.

    `gguf.GGUFReader` makes one numpy view per array element, which takes seconds on a vocabulary of
    50k strings; this reads the same layout (header, key-values, tensor infos, aligned data) directly.
    """

    path: Path
    metadata: dict[str, Any]
    tensors: list[GGUFTensor]


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")


def open_gguf(path: str | Path) -> GGUFFile:
    """Parse a GGUF file's header; a clear error when it is missing, truncated or not GGUF at all.

    A start reads the header twice (the config, then the tokenizer): the last file parsed is kept, by its
    path, size, modification time and inode, and handed out again with a metadata dict of its own. A file
    modified in the last few seconds is parsed every time (git's rule for racy timestamps: a rewrite within
    the clock's granularity could keep all four)."""
    path = Path(path)
    try:
        st = path.stat()
        stamp = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
        if time.time_ns() - st.st_mtime_ns < 3_000_000_000:
            stamp = None
    except OSError:
        stamp = None
    if stamp is not None and _last[0] == stamp:
        file = _last[1]
        return GGUFFile(path, dict(file.metadata), file.tensors)
    file = _open(path)
    _last[:] = [stamp, file]
    return GGUFFile(path, dict(file.metadata), file.tensors)


_last: list = [None, None]  # (stamp, GGUFFile) of the last file parsed


def _open(path: Path) -> GGUFFile:
    try:
        buf = np.memmap(path, dtype=np.uint8, mode="r")
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: no such file; pass the path of an existing .gguf file") from None
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: cannot be read ({e}); pass a readable .gguf file") from None
    try:
        return _parse(path, buf.view(np.ndarray))  # plain views: memmap subclasses slow numpy down
    except (struct.error, IndexError, KeyError, ValueError, OverflowError, UnicodeDecodeError, ZeroDivisionError,
            RecursionError) as e:
        raise ModelLoadError(
            f"{path}: not a valid GGUF file, or truncated ({type(e).__name__}: {e}); re-download it"
        ) from None


# The fewest bytes one item of a GGUF metadata array, or one key/value pair, or one tensor entry can take: every
# count the header claims is checked against the bytes left before anything is read or allocated for it (a
# header claiming 2^40 entries is refused at once, not read until memory runs out).
_MIN_ITEM = {_STRING: 8, _ARRAY: 12}
_MIN_KV, _MIN_TENSOR = 8 + 4 + 1, 8 + 4 + 4 + 8
_MAX_NESTING = 4  # arrays of arrays: GGUF files use one level
_MAX_DIMS = 4  # GGML_MAX_DIMS


def _parse(path: Path, buf: np.ndarray) -> GGUFFile:
    mem = memoryview(buf)
    pos = 0

    def room(count: int, size: int, what: str) -> None:
        if count * size > len(mem) - pos:
            raise ValueError(f"{what} claims {count:,} entries, more than the {len(mem) - pos:,} bytes left hold")

    def unpack(fmt: str) -> Any:
        nonlocal pos
        value = struct.unpack_from(fmt, mem, pos)[0]
        pos += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal pos
        n = unpack("<Q")
        if pos + n > len(mem):
            raise ValueError("string runs past the end of the file")
        pos += n
        return bytes(mem[pos - n : pos]).decode("utf-8")

    def value(kind: int, depth: int = 0) -> Any:
        nonlocal pos
        if kind == _STRING:
            return string()
        if kind != _ARRAY:
            return unpack(_SCALARS[kind])
        if depth >= _MAX_NESTING:
            raise ValueError(f"metadata arrays nested over {_MAX_NESTING} deep")
        item, count = unpack("<I"), unpack("<Q")
        if item not in _SCALARS and item not in _MIN_ITEM:
            raise ValueError(f"metadata array of unknown type {item}")
        room(count, struct.calcsize(_SCALARS[item]) if item in _SCALARS else _MIN_ITEM[item], "a metadata array")
        if item in _SCALARS:  # numeric arrays (token types, scores) in one read
            dtype = np.dtype(_SCALARS[item])
            end = pos + count * dtype.itemsize
            if end > len(mem):
                raise ValueError("array runs past the end of the file")
            out = np.frombuffer(mem[pos:end], dtype=dtype).tolist()
            pos = end
            return out
        if item == _STRING:  # a vocabulary's tokens and merges: ~100k strings, in one tight loop
            return strings(count)
        return [value(item, depth + 1) for _ in range(count)]

    def strings(count: int) -> list[str]:
        nonlocal pos
        out, at, end, length = [], pos, len(mem), _U64.unpack_from
        for _ in range(count):
            n = length(mem, at)[0]
            at += 8
            if at + n > end:
                raise ValueError("string runs past the end of the file")
            out.append(str(mem[at : at + n], "utf-8"))
            at += n
        pos = at
        return out

    if bytes(mem[:4]) != b"GGUF":
        raise ValueError("no GGUF magic at the start")
    pos = 4
    version = unpack("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (big-endian or too old); versions 2 and 3 are read")
    n_tensors, n_kv = unpack("<Q"), unpack("<Q")
    room(n_kv, _MIN_KV, "the metadata")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = string()
        meta[key] = value(unpack("<I"))
    room(n_tensors, _MIN_TENSOR, "the tensor list")
    infos = []
    for _ in range(n_tensors):
        name = string()
        n_dims = unpack("<I")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise ValueError(f"tensor {name!r} has {n_dims} dimensions (1 to {_MAX_DIMS} expected)")
        dims = [unpack("<Q") for _ in range(n_dims)]
        infos.append((name, tuple(reversed(dims)), gguf.GGMLQuantizationType(unpack("<I")), unpack("<Q")))
    align = meta.get("general.alignment", 32)
    if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
        raise ValueError(f"general.alignment is {align!r}, not a power of two")
    start = -(-pos // align) * align
    tensors = []
    for name, shape, kind, offset in infos:
        block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
        row_bytes = shape[-1] // block * block_bytes
        n_bytes = row_bytes * math.prod(shape[:-1])  # Python integers: a huge claimed shape cannot wrap around
        begin = start + offset
        if begin + n_bytes > len(buf):
            raise ValueError(f"tensor {name} runs past the end of the file")
        data = buf[begin : begin + n_bytes].reshape(*shape[:-1], row_bytes)
        tensors.append(GGUFTensor(name, shape, kind, data))
    return GGUFFile(path, meta, tensors)


def gguf_to_hf_name(name: str, arch: str = "llama") -> str | None:
    """Our parameter name for a GGUF tensor name, or None for tensors we do not load as parameters."""
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
    block_names = {**_BLOCK_NAMES, **family(arch).gguf_names}
    if m and m.group(2) in block_names:
        return f"layers.{m.group(1)}.{block_names[m.group(2)]}.{m.group(3)}"
    m = re.fullmatch(r"(\w+)\.(weight|bias)", name)
    if m and m.group(1) in _TOP_NAMES:
        return f"{_TOP_NAMES[m.group(1)]}.{m.group(2)}"
    return None


def hf_to_gguf_name(name: str, arch: str = "llama") -> str:
    """llama.cpp's name for our parameter `name` (`layers.3.self_attn.q_proj.weight` -> `blk.3.attn_q.weight`): the
    inverse of gguf_to_hf_name, for writing a GGUF."""
    top = {ours: theirs for theirs, ours in _TOP_NAMES.items()}
    block = {ours: theirs for theirs, ours in {**_BLOCK_NAMES, **family(arch).gguf_names}.items()}
    module, _, kind = name.rpartition(".")
    if module in top:
        return f"{top[module]}.{kind}"
    _, i, rest = module.split(".", 2)
    return f"blk.{i}.{block[rest]}.{kind}"


def permuted_heads(name: str, arch: str, n_heads: int, n_kv_heads: int) -> int | None:
    """The head count to un-permute the rows of our parameter `name` with (q and k of a family whose converter
    permuted them for llama.cpp's adjacent-pair rotary), or None: stored as we hold it."""
    if not family(arch).gguf_permuted_qk:
        return None
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return n_heads
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        return n_kv_heads
    return None


def unpermute_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo convert_hf_to_gguf's `permute`: per head, rows [pairs interleaved] back to [halves]."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def dequantize(tensor: GGUFTensor, path: Path) -> torch.Tensor:
    """One tensor as fp32 in PyTorch's [out, in] order, whatever its GGUF type. A matrix is dequantized
    DEQUANT_ROWS rows at a time into its fp32 result: gguf's block decoders make several temporaries the size
    of their input (an 8B embedding's whole-tensor ones are GBs)."""
    kind, data = tensor.kind, tensor.data
    try:
        out = np.empty(tensor.shape, dtype=np.float32)  # a copy: the file is mapped read-only
        if data.ndim < 2:
            out[...] = gguf.quants.dequantize(data, kind)
        for r in range(0, data.shape[0] if data.ndim > 1 else 0, DEQUANT_ROWS):
            out[r : r + DEQUANT_ROWS] = gguf.quants.dequantize(data[r : r + DEQUANT_ROWS], kind)
        _drop_pages(data)
        return torch.from_numpy(out)
    except NotImplementedError:
        raise _cannot_dequantize(tensor, path) from None


def dequantize_rows(tensor: GGUFTensor, path: Path, start: int, stop: int) -> torch.Tensor:
    """Rows start..stop of a matrix as fp32 (a copy), their file pages dropped after."""
    data = tensor.data[start:stop]
    try:
        out = np.array(gguf.quants.dequantize(data, tensor.kind), dtype=np.float32, copy=True)
    except NotImplementedError:
        raise _cannot_dequantize(tensor, path) from None
    _drop_pages(data)
    return torch.from_numpy(out.reshape(stop - start, tensor.shape[-1]))


def _cannot_dequantize(tensor: GGUFTensor, path: Path) -> ModelLoadError:
    return ModelLoadError(
        f"{path}: tensor {tensor.name} is stored as {tensor.kind.name}, which Parley cannot dequantize; "
        "use a GGUF of type F32, F16, BF16, Q4_0/1, Q5_0/1, Q8_0, a K-quant (Q2_K..Q6_K) or an IQ type")


DEQUANT_ROWS = 8192


def _drop_pages(data: np.ndarray) -> None:
    """Let the kernel unmap a tensor's file pages once it is decoded: mapped in, they count in the process's
    RSS (4.7 GB for an 8B Q4_0 file) and are read again from the file if anything decodes them again."""
    array = data
    while isinstance(array.base, np.ndarray):
        array = array.base
    if not isinstance(array.base, mmap.mmap) or data.nbytes == 0:
        return
    # where the data sits in the mapping (np.memmap maps from its offset rounded down to the granularity)
    start = data.ctypes.data - array.ctypes.data + getattr(array, "offset", 0) % mmap.ALLOCATIONGRANULARITY
    first = start // mmap.PAGESIZE * mmap.PAGESIZE
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no madvise here: the pages stay mapped in
        array.base.madvise(mmap.MADV_DONTNEED, first, start + data.nbytes - first)


_DECODER_LINEAR = re.compile(r"layers\.\d+\.(self_attn|mlp)\.\w+_proj\.weight")


def iter_weights(file: GGUFFile, arch: str, n_heads: int, n_kv_heads: int, int4: Imported | None = None,
                 on_use: dict[str, Callable[[], dict[str, torch.Tensor]]] | None = None
                 ) -> Iterator[tuple[str, torch.Tensor]]:
    """(our name, fp32 tensor) for every parameter in the file, with q/k rows un-permuted.

    `int4` given: each decoder linear comes as Int4Linear's tensors instead (`prefix.qweight`, ...; the
    file's own 4-bit blocks where it has them, models/gguf_int4.py), tallied in `int4`. `on_use` given too:
    those tensors, and an untied output head, come on the meta device (shapes from the header), and a reader
    that decodes them from the mapped file is put in `on_use` by module name (models/read_on_use.py).
    Gemma's norms come as llama.cpp's converter stored them, 1 + w: the gain our model holds."""
    path = file.path
    for tensor in file.tensors:
        name = gguf_to_hf_name(tensor.name, arch)
        if name is None:
            if tensor.name == "rope_freqs.weight":  # llama3 rope scaling, as per-frequency divisors
                yield "rope_freqs", dequantize(tensor, path)
            continue
        heads = permuted_heads(name, arch, n_heads, n_kv_heads)
        rows = (lambda t, h=heads: unpermute_rotary(t, h)) if heads else None
        if int4 is not None and _DECODER_LINEAR.fullmatch(name):
            if tensor.shape[-1] % 32 or tensor.shape[0] % 8:
                raise ModelLoadError(f"{path}: tensor {tensor.name} has shape {tensor.shape}; INT4 import needs "
                                     "in % 32 == 0 and out % 8 == 0 -- use --quant awq or none")
            int4.add(tensor.kind)
            prefix = name.removesuffix(".weight")
            read = Int4Reader(tensor, path, rows)
            if on_use is not None:
                on_use[prefix] = read
                yield from ((f"{prefix}.{key}", t) for key, t in _int4_meta(tensor).items())
                continue
            yield from ((f"{prefix}.{key}", t) for key, t in read().items())
            continue
        if on_use is not None and int4 is not None and name in ("lm_head.weight", "embed_tokens.weight"):
            on_use[name.removesuffix(".weight")] = MatrixReader(tensor, path)
            yield name, torch.empty(tensor.shape, dtype=torch.float32, device="meta")
            continue
        w = dequantize(tensor, path)
        yield name, (rows(w) if rows else w)


def _int4_meta(tensor: GGUFTensor) -> dict[str, torch.Tensor]:
    """The Int4Linear tensors `int4_tensors` makes of a decoder linear, as shapes on the meta device."""
    from .gguf_int4 import GROUP, WITH_MINS

    out, inp = tensor.shape[0], tensor.shape[-1]
    shapes = {"qweight": ((inp, out // 8), torch.int32), "qzeros": ((inp // GROUP, out // 8), torch.int32),
              "scales": ((inp // GROUP, out), torch.float16)}
    if tensor.kind in WITH_MINS:  # first, as int4_tensors yields them
        shapes = {"mins": ((inp // GROUP, out), torch.float16), **shapes}
    return {key: torch.empty(shape, dtype=dtype, device="meta") for key, (shape, dtype) in shapes.items()}


class MatrixReader:
    """An untied output head or the embedding table, decoded from the mapped file when used: whole (a call, as
    `ReadOnUse` reads), a row block at a time (`row_block`: what the native step's int8 head packing reads), or
    the rows of some token ids (`lookup`: an embedding's)."""

    def __init__(self, tensor: GGUFTensor, path: Path) -> None:
        self.tensor, self.path = tensor, path

    def __call__(self) -> dict[str, torch.Tensor]:
        return {"weight": dequantize(self.tensor, self.path)}

    def row_block(self, start: int, stop: int) -> torch.Tensor:
        return dequantize_rows(self.tensor, self.path, start, stop)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` [n] as fp32 [n, cols], decoded as `dequantize` decodes them (bitwise the same values: the
        block decoders work block by block). Their file pages stay mapped: a reply's tokens come back."""
        data = self.tensor.data[ids.numpy()]  # a copy of those rows' blocks
        try:
            out = gguf.quants.dequantize(data, self.tensor.kind)
        except NotImplementedError:
            raise _cannot_dequantize(self.tensor, self.path) from None
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32).reshape(len(ids), self.tensor.shape[-1]))


class Int4Reader:
    """A decoder linear decoded from the mapped file when used: as Int4Linear's tensors (a call), or as the
    integers row by row that the native step packs (`rows`: no round trip through the AWQ packing)."""

    def __init__(self, tensor: GGUFTensor, path: Path, reorder: Callable[[torch.Tensor], torch.Tensor] | None
                 ) -> None:
        self.tensor, self.path, self.reorder = tensor, path, reorder

    def __call__(self) -> dict[str, torch.Tensor]:
        from .gguf_int4 import int4_tensors

        return self._decode(int4_tensors)

    def rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        from .gguf_int4 import int4_rows

        return self._decode(int4_rows)

    def _decode(self, convert):
        from .gguf_int4 import FOUR_BIT

        fp = None if self.tensor.kind in FOUR_BIT else dequantize(self.tensor, self.path)
        out = convert(self.tensor.kind, self.tensor.data, fp, self.reorder)
        _drop_pages(self.tensor.data)
        return out


def four_bit_types(path: str | Path) -> str | None:
    """'Q4_1' (or 'Q4_K/...'): the 4-bit types of a GGUF's decoder linears, from its header; None when none is."""
    from .gguf_int4 import FOUR_BIT

    kinds = {t.kind.name for t in open_gguf(path).tensors
             if t.kind in FOUR_BIT and t.name.startswith("blk.") and t.name.endswith(".weight")}
    return "/".join(sorted(kinds)) or None
