"""The native CPU library: built once per machine with the system C++ compiler, loaded with ctypes.

The kernels are C++ headers under `kernels/cpu/` (products, row operations, attention, tree passes, and their
entry points in `abi.h`); the translation unit that includes them is the caller's: `models/native_forward.cpp`,
which adds the forward pass over a model's layers, and names its source here through `models/native_forward.py`.
So this module builds and loads whatever main source it is given, and types the kernels' own entry points; the
kernels never know the model code that drives them (models -> kernels, never back). One main source means one
library: kernel-only callers (the thread count, tests of one product) take the same library from the models side.

Why ctypes and not a torch extension: the library includes no torch headers, so it compiles in seconds
(a torch extension takes a minute) and a build at first use or in `scripts/setup.sh` costs nothing noticeable.
Tensors cross as raw pointers; the caller keeps them alive (see `models/native_step.py`).

The build is keyed by the main source and every header it includes (`sources`), the compiler flags and this
CPU's feature flags, written to a temporary name and renamed into place, so a half-written library is never
loaded; its SHA-256 is recorded beside it and checked before every load, so a library changed or damaged in the
cache folder is rebuilt, not run. No compiler: `load()` returns None and says why once; the engine then runs its
PyTorch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor

from ..cache_files import cache_dir as parley_cache_dir
from ..cache_files import file_sha256
from .reference import unpack_int4

log = logging.getLogger(__name__)

FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC",
         "-std=c++17"]
W_Q4, W_F32, W_Q8, W_BF16 = 0, 1, 2, 3
KV_KINDS = {"fp": 0, "bf16": 1, "int8": 2, "k8v4": 3}

_lock = threading.Lock()
_libs: dict[Path, ctypes.CDLL] = {}  # by main source: loaded once per process
_why_not: dict[Path, str] = {}  # by main source: why it could not be had (said once)


class Lin(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("N", ctypes.c_int32), ("K", ctypes.c_int32), ("group", ctypes.c_int32),
                ("q", ctypes.c_void_p), ("s", ctypes.c_void_p), ("s16", ctypes.c_void_p), ("z", ctypes.c_void_p),
                ("w", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("act_block", ctypes.c_int32),
                ("m16", ctypes.c_void_p)]


class KV(ctypes.Structure):
    _fields_ = [("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("ks", ctypes.c_void_p), ("vs", ctypes.c_void_p),
                ("vm", ctypes.c_void_p)]


class Cache(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("max_len", ctypes.c_int32), ("layers", ctypes.POINTER(KV))]


STRUCTS = (Lin, KV, Cache)  # the ctypes mirror of the kernels' structs (kernels/cpu/products.h, attention.h)


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def cache_dir() -> Path:
    """PARLEY_NATIVE_DIR, else native/ in the Parley cache (PARLEY_CACHE_DIR or the platform's cache dir)."""
    if os.environ.get("PARLEY_NATIVE_DIR"):
        return Path(os.environ["PARLEY_NATIVE_DIR"])
    return parley_cache_dir("native")


def flags() -> list[str]:
    """The compiler flags, plus PARLEY_NATIVE_FLAGS (e.g. `-mno-avx512vnni`: the portable loops, as CPUs
    without AVX-512 VNNI get them; the tests build that variant too)."""
    return [*FLAGS, *shlex.split(os.environ.get("PARLEY_NATIVE_FLAGS", ""))]


_INCLUDE = re.compile(rb'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def sources(source: Path) -> list[Path]:
    """`source` and every file it includes with `#include "..."`, transitively (paths relative to the including
    file), in the order first met: what the library is built from."""
    found: list[Path] = []
    todo = [Path(source).resolve()]
    while todo:
        path = todo.pop(0)
        if path in found:
            continue
        found.append(path)
        todo += [(path.parent / name.decode()).resolve() for name in _INCLUDE.findall(path.read_bytes())]
    return found


def library_path(source: Path) -> Path:
    """Where the library built from `source` (and its headers) with these flags on this CPU lives."""
    h = hashlib.sha256()
    main = Path(source).resolve()
    for path in sources(main):
        h.update(os.path.relpath(path, main.parent).encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(" ".join(flags()).encode() + _cpu_flags().encode())
    return cache_dir() / f"libparley_step-{h.hexdigest()[:16]}.so"


def build(source: Path, verbose: bool = False) -> Path:
    """Compile `source` for this machine unless a library matching its recorded hash is there; its path."""
    out = library_path(source)
    record = out.with_name(out.name + ".sha256")
    if out.exists():
        try:
            if record.read_text().strip() == file_sha256(out):
                return out
        except OSError:
            pass
        log.warning("%s does not match its recorded SHA-256: rebuilding it", out)
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not cxx:
        raise RuntimeError("no C++ compiler found (install g++, e.g. `apt-get install g++`)")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        r = subprocess.run([cxx, *flags(), str(source), "-o", tmp], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{cxx} failed to build {Path(source).name}:\n{r.stderr.strip()[-2000:]}")
        Path(tmp + ".sha256").write_text(file_sha256(Path(tmp)) + "\n")
        os.replace(tmp + ".sha256", record)  # the record first: a library is never there without it
        os.replace(tmp, out)
    finally:
        for leftover in (tmp, tmp + ".sha256"):
            if os.path.exists(leftover):
                os.unlink(leftover)
    if verbose:
        print(f"built {out}")
    return out


def load(source: Path) -> ctypes.CDLL | None:
    """The library built from `source`, building it on first use, with the kernels' entry points typed; None
    (with the reason logged once) where it cannot be had. The caller types the entry points its source adds."""
    key = Path(source).resolve()
    with _lock:
        if key in _libs or key in _why_not:
            return _libs.get(key)
        if os.environ.get("PARLEY_NATIVE", "1") == "0":
            _why_not[key] = "PARLEY_NATIVE=0"
            return None
        try:
            lib = ctypes.CDLL(str(build(key)))
        except (RuntimeError, OSError) as e:
            _why_not[key] = str(e)
            log.warning("the native CPU step is unavailable, so decoding runs on the slower PyTorch path: %s", e)
            return None
        lib.parley_kv_move.restype = ctypes.c_int
        lib.parley_kv_move.argtypes = [ctypes.POINTER(Cache), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                       ctypes.c_void_p, ctypes.c_void_p]
        lib.parley_threads.restype = ctypes.c_int
        lib.parley_threads.argtypes = [ctypes.c_int]
        lib.parley_has_vnni.restype = ctypes.c_int
        lib.parley_simd.restype = ctypes.c_int
        lib.parley_hadamard_row.restype = None
        lib.parley_hadamard_row.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        lib.parley_layout.restype = ctypes.c_int
        lib.parley_layout.argtypes = [ctypes.c_int, *[ctypes.POINTER(t) for t in (ctypes.c_char_p, ctypes.c_char_p,
                                                                               ctypes.c_int, ctypes.c_int)]]
        lib.parley_linear.restype = ctypes.c_int
        lib.parley_linear.argtypes = [ctypes.POINTER(Lin), ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lib.parley_vnni_peak_gmacs.restype = ctypes.c_double
        lib.parley_vnni_peak_gmacs.argtypes = [ctypes.c_int]
        lib.parley_profile.restype = ctypes.c_int
        lib.parley_profile.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.parley_read_gbs.restype = ctypes.c_double
        lib.parley_read_gbs.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
        lib.parley_attention.restype = ctypes.c_int
        lib.parley_attention.argtypes = [ctypes.POINTER(Cache), ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                         ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                         ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        _libs[key] = lib
        return lib


def why_unavailable(source: Path) -> str | None:
    """Why the library built from `source` cannot be had (trying it first), or None when it loads."""
    load(source)
    return _why_not.get(Path(source).resolve())


def library_layout(lib: ctypes.CDLL) -> dict[tuple[str, str], tuple[int, int]]:
    """(struct, field) -> (offset, size) as the compiler laid the structs out; field "" is the whole struct."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    kind, field = ctypes.c_char_p(), ctypes.c_char_p()
    offset, size = ctypes.c_int(), ctypes.c_int()
    i = 0
    while lib.parley_layout(i, ctypes.byref(kind), ctypes.byref(field), ctypes.byref(offset), ctypes.byref(size)):
        out[(kind.value.decode(), field.value.decode())] = (offset.value, size.value)
        i += 1
    return out


def mirror_layout(structs: tuple[type[ctypes.Structure], ...] = STRUCTS) -> dict[tuple[str, str], tuple[int, int]]:
    """The same table for ctypes mirrors (the kernels' here, by default)."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for struct in structs:
        out[(struct.__name__, "")] = (0, ctypes.sizeof(struct))
        for name, _ in struct._fields_:
            f = getattr(struct, name)
            out[(struct.__name__, name)] = (f.offset, f.size)
    return out


# -- weight packing: tensors in the layouts the products read (kernels/cpu/products.h) ------------------------

def _pad_columns(t: Tensor, n: int) -> Tensor:
    """[N, ...] -> [n, ...] with zero rows appended (the last 16-column block of a ragged N)."""
    return torch.cat([t, t.new_zeros(n - t.shape[0], *t.shape[1:])]) if n > t.shape[0] else t


@contextmanager
def reused_heap() -> Iterator[None]:
    """While packing, glibc's malloc serves every block from its heap and keeps what is freed, so the next
    temporary reuses pages already faulted in; at the end what is free goes back to the system
    (`malloc_trim`). Why: packing makes temporaries of tens to hundreds of MB per matrix, and each one
    mmapped afresh is faulted in and zeroed by the kernel (without this, 28% of an 8B GGUF's first-start CPU
    time is `clear_page_erms`). A no-op without glibc's `mallopt`."""
    libc = _libc()
    if libc is None:
        yield
        return
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
    libc.mallopt(M_MMAP_MAX, 0)
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)  # an int: the largest power of two it takes
    try:
        yield
    finally:
        libc.mallopt(M_MMAP_MAX, 65536)  # glibc's default
        libc.mallopt(M_TRIM_THRESHOLD, 64 << 20)  # where its own adjustment ends (twice the largest mmap threshold)
        libc.malloc_trim(0)


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except (OSError, TypeError):  # no C library by that name (Windows)
        return None


def pack_q4(q: Tensor, zeros: Tensor, scales: Tensor, group_size: int,
            mins: Tensor | None = None) -> dict[str, Tensor]:
    """q [K, N] ints 0..15, zeros/scales [K/group, N] (W = (q - z) * s): `pack_q4_rows` of their transposes."""
    return pack_q4_rows(q.t(), zeros.t(), scales.t(), group_size, None if mins is None else mins.t())


def pack_q4_rows(q: Tensor, zeros: Tensor, scales: Tensor, group_size: int,
                 mins: Tensor | None = None) -> dict[str, Tensor]:
    """q [N, K] ints 0..15, zeros/scales [N, K/group] (W = (q - z) * s) -> the products' column-block layout.

    Per block of 16 output columns and chunk of 64 inputs, 8 vectors of 64 bytes: byte 4n + j of vector t
    holds input 4t + j of column n (low nibble) and input 32 + 4t + j (high nibble), so one VNNI
    instruction takes 4 inputs of 16 columns. Scales (fp16, as the checkpoint stores them) and zero points
    (uint8) are [N/16][K/group][16]: 3 bytes per group, not 8 as fp32 scale and minimum would take. N is
    padded to a multiple of 16 with zero columns. Groups of 32 (GGUF's Q4 formats) and a float minimum per
    group (`mins`, fp16 numbers, W = (q - z) * s + m: key "m16") are read by the products in blocks of 32.
    Rows in, as GGUF stores a weight: a uint8 matrix is never transposed (a byte-strided copy, the slowest
    step a start on a GGUF's own blocks would otherwise take).
    """
    N, K = q.shape
    if K % 64 or group_size % 32 or (group_size % 64 and group_size != 32):
        raise ValueError(f"the native step needs in_features ({K}) divisible by 64 and a group size of 32 or a "
                         f"multiple of 64, not {group_size}")
    Np = (N + 15) // 16 * 16
    qn = _pad_columns(q.to(torch.uint8), Np)                          # [Np, K]
    qn = qn.reshape(Np // 16, 16, K // 64, 2, 32)                     # block, n, chunk, half, (t, j)
    packed = (qn[:, :, :, 0] | (qn[:, :, :, 1] << 4)).contiguous()    # block, n, chunk, (t, j)
    # n moved inside (chunk, t) as 4-byte words (j rides along): a quarter of the elements a byte permute moves
    words = packed.view(torch.int32).reshape(Np // 16, 16, K // 64 * 8).transpose(1, 2).contiguous()
    packed = words.view(torch.uint8).reshape(Np // 16, K // 64, 8, 16, 4)  # block, chunk, t, n, j

    def blocks(t: Tensor) -> Tensor:  # [N, G] -> [Np/16, G, 16]
        t = _pad_columns(t.float(), Np)
        return t.reshape(Np // 16, 16, -1).transpose(1, 2).contiguous()

    if not torch.equal(scales.half().float(), scales.float()):
        raise ValueError("the native step needs INT4 scales that are fp16 numbers (as AWQ checkpoints store them)")
    out = {"q": packed, "s16": blocks(scales).half().view(torch.int16), "z": blocks(zeros).to(torch.uint8)}
    if mins is not None:
        if not torch.equal(mins.half().float(), mins.float()):
            raise ValueError("the native step needs INT4 minimums that are fp16 numbers")
        out["m16"] = blocks(mins).half().view(torch.int16)
    return out


def awq_to_q4(qweight: Tensor, qzeros: Tensor, scales: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """AWQ GEMM tensors -> q [K, N], zeros [G, N], scales [G, N] in natural column order."""
    return unpack_int4(qweight), unpack_int4(qzeros), scales


def quantize_q8_rows(weight: Tensor) -> tuple[Tensor, Tensor]:
    """A dense [N, K] weight as int8 per output row (symmetric): (q int8 [N, K], fp32 row scales [N])."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-30) / 127
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale.contiguous()


def pack_q8(weight: Tensor) -> dict[str, Tensor]:
    """A dense [N, K] weight -> the int8 head's column-block layout: per 16 columns and 64 inputs, 16 vectors
    of 64 bytes, byte 4n + j of vector t = w[n][4t + j] + 128 (unsigned, for VNNI); N padded to 16.
    `weight` is read by `.shape` and row slices only: a weight read from its file block by block will do."""
    N, K = weight.shape
    if K % 64:
        raise ValueError(f"the native head needs a hidden size divisible by 64, not {K}")
    Np = (N + 15) // 16 * 16
    u = torch.empty(Np // 16, K // 64, 16, 16, 4, dtype=torch.uint8)
    scale = torch.empty(N, dtype=torch.float32)
    for r0 in range(0, N, Q8_ROWS):  # rows a block at a time: an 8B head's fp32 temporaries are 2.1 GB each
        q, scale[r0 : r0 + Q8_ROWS] = quantize_q8_rows(weight[r0 : r0 + Q8_ROWS])
        n = (len(q) + 15) // 16 * 16
        block = (_pad_columns(q, n).to(torch.int16) + 128).to(torch.uint8)  # [n, K]
        u[r0 // 16 : (r0 + n) // 16] = block.reshape(n // 16, 16, K // 64, 16, 4).permute(0, 2, 3, 1, 4)
    return {"q": u, "s": scale}


Q8_ROWS = 8192  # a multiple of 16: each block is whole column blocks of the layout


def lin(kind: int, N: int, K: int, group: int = 0, q: Tensor | None = None, s: Tensor | None = None,
        s16: Tensor | None = None, z: Tensor | None = None, w: Tensor | None = None,
        bias: Tensor | None = None, act_block: int = 64, m16: Tensor | None = None) -> Lin:
    """`act_block`: the block of inputs (64 or 32) an INT4 product's activations are quantized in; a group of
    32 or a minimum per group (`m16`) needs 32."""
    def ptr(t: Tensor | None) -> int | None:
        if t is None:
            return None
        assert t.is_contiguous() and t.device.type == "cpu", "native tensors must be contiguous CPU tensors"
        return t.data_ptr()

    if act_block not in (32, 64):
        raise ValueError(f"act_block must be 32 or 64, not {act_block}")
    if act_block != 32 and kind == W_Q4 and (group == 32 or m16 is not None):
        raise ValueError("INT4 products in groups of 32 or with minimums read activations in blocks of 32")
    return Lin(kind, N, K, group, ptr(q), ptr(s), ptr(s16), ptr(z), ptr(w), ptr(bias), act_block, ptr(m16))
