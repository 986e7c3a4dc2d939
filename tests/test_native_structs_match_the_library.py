"""The ctypes structs lay out exactly as the compiled library's: the kernels' (Lin, KV, Cache in kernels/native.py,
C++ in kernels/cpu/) and the model's (Layer, Model in models/native_forward.py, C++ in models/native_forward.cpp).
Every field of either side is on the other, at the same offset with the same size, and every struct has the same
size, as the library's `parley_layout` table says. A field added on one side only (or in another order) would hand
the library garbage pointers silently."""

from __future__ import annotations

import pytest

from parley.kernels import native
from parley.models import native_forward

pytestmark = pytest.mark.skipif(native_forward.library() is None,
                                reason=f"native step unavailable: {native_forward.why_unavailable()}")


def test_mirror_matches_the_compiled_structs():
    library, mirror = native.library_layout(native_forward.library()), native_forward.mirror_layout()
    assert {k for k, _ in library} == {s.__name__ for s in native_forward.STRUCTS}, "a struct is missing on one side"
    only_c = sorted(set(library) - set(mirror))
    only_py = sorted(set(mirror) - set(library))
    assert not only_c, (f"fields in the C++ structs missing from their ctypes mirror (kernels/native.py, "
                        f"models/native_forward.py): {only_c}")
    assert not only_py, (f"fields of the ctypes mirror missing from the library's parley_layout table "
                         f"(kernels/cpu/abi.h, models/native_forward.cpp): {only_py}")
    wrong = {k: (mirror[k], library[k]) for k in library if mirror[k] != library[k]}
    assert not wrong, f"(offset, size) in Python vs C: {wrong}"

