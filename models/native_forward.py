"""The native forward pass (`native_forward.cpp` beside this file) as Python sees it: the library's main source,
the library itself, and the ctypes mirror of the structs that describe a model's layers to it.

`native_forward.cpp` is the library's one translation unit: it includes the kernels (`kernels/cpu/*.h`) and adds
the forward pass over a model's layers. `kernels/native.py` builds and loads whatever source it is given; this
module names the source, so the kernels never know the model code (models -> kernels). Everything that wants the
library, the kernel-only entry points included (`engine/threads.py`, the benches, the tests), takes it from
`library()` here: one library, built once per machine.

`Layer` and `Model` mirror the structs of `native_forward.cpp`; `Lin`, `KV` and `Cache` (the kernels' own) stay
in `kernels/native.py`. `tests/test_native_structs_match_the_library.py` checks all of them against the layout
table the library exports.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from ..kernels import native
from ..kernels.native import Lin

SOURCE = Path(__file__).with_name("native_forward.cpp")


class Layer(ctypes.Structure):
    _fields_ = [("attn_norm", ctypes.c_void_p), ("ffn_norm", ctypes.c_void_p), ("q_norm", ctypes.c_void_p),
                ("k_norm", ctypes.c_void_p), ("qkv", Lin), ("o", Lin), ("gate_up", Lin), ("down", Lin),
                ("window", ctypes.c_int32), ("post_attn_norm", ctypes.c_void_p), ("post_ffn_norm", ctypes.c_void_p),
                ("rope_cos", ctypes.c_void_p), ("rope_sin", ctypes.c_void_p), ("down_diag", ctypes.c_void_p),
                ("down_block", ctypes.c_int32)]


class Model(ctypes.Structure):
    _fields_ = [("dim", ctypes.c_int32), ("n_layers", ctypes.c_int32), ("n_heads", ctypes.c_int32),
                ("n_kv_heads", ctypes.c_int32), ("head_dim", ctypes.c_int32), ("inter", ctypes.c_int32),
                ("vocab", ctypes.c_int32), ("eps", ctypes.c_float), ("embed", ctypes.c_void_p),
                ("final_norm", ctypes.c_void_p), ("rope_cos", ctypes.c_void_p), ("rope_sin", ctypes.c_void_p),
                ("max_pos", ctypes.c_int32), ("head", Lin), ("layers", ctypes.POINTER(Layer)),
                ("embed_scale", ctypes.c_float), ("attn_scale", ctypes.c_float), ("act", ctypes.c_int32),
                ("embed_dtype", ctypes.c_int32)]


STRUCTS = (*native.STRUCTS, Layer, Model)  # every struct the library takes: its layout table's


_typed: ctypes.CDLL | None = None  # the library whose forward entry points are typed


def library() -> ctypes.CDLL | None:
    """The native library (built on first use), every entry point typed; None where it cannot be had
    (`why_unavailable` says why, and the engine runs its PyTorch path)."""
    global _typed
    lib = native.load(SOURCE)
    if lib is None or lib is _typed:
        return lib
    cache_p = ctypes.POINTER(native.Cache)
    lib.parley_forward.restype = ctypes.c_int
    lib.parley_forward.argtypes = [ctypes.POINTER(Model), cache_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.c_int, ctypes.c_void_p]
    lib.parley_forward_tree.restype = ctypes.c_int
    lib.parley_forward_tree.argtypes = [ctypes.POINTER(Model), cache_p, ctypes.c_int, ctypes.c_void_p,
                                        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.parley_forward_batch.restype = ctypes.c_int
    lib.parley_forward_batch.argtypes = [ctypes.POINTER(Model), ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                         ctypes.c_void_p, ctypes.c_void_p]
    _typed = lib
    return lib


def why_unavailable() -> str | None:
    """Why the library cannot be had (trying it first), or None when it loads."""
    return native.why_unavailable(SOURCE)


def library_path() -> Path:
    """Where this machine's library is (or would be) built."""
    return native.library_path(SOURCE)


def build(verbose: bool = False) -> Path:
    """Build the library now unless it is there (`scripts/setup.sh`); its path."""
    return native.build(SOURCE, verbose)


def mirror_layout() -> dict[tuple[str, str], tuple[int, int]]:
    """(struct, field) -> (offset, size) of the ctypes mirror of every struct the library takes."""
    return native.mirror_layout(STRUCTS)
