"""The ctypes structs in kernels/native.py lay out exactly as the compiled cpu_step.cpp's: every field of
either side is on the other, at the same offset with the same size, and every struct has the same size. A
field added on one side only (or in another order) would hand the library garbage pointers silently."""

from __future__ import annotations

import pytest

from parley.kernels import native

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"native step unavailable: {native.why_unavailable()}")


def test_mirror_matches_the_compiled_structs():
    library, mirror = native.library_layout(native.load()), native.mirror_layout()
    assert {k for k, _ in library} == {s.__name__ for s in native.STRUCTS}, "a struct is missing on one side"
    only_c = sorted(set(library) - set(mirror))
    only_py = sorted(set(mirror) - set(library))
    assert not only_c, f"fields in cpu_step.cpp missing from kernels/native.py: {only_c}"
    assert not only_py, f"fields in kernels/native.py missing from cpu_step.cpp's parley_layout table: {only_py}"
    wrong = {k: (mirror[k], library[k]) for k in library if mirror[k] != library[k]}
    assert not wrong, f"(offset, size) in Python vs C: {wrong}"
