"""The native library is loaded only if it matches the SHA-256 recorded when it was built: one changed or
damaged in the cache folder (or without a record) is rebuilt, never run."""

from __future__ import annotations

import hashlib
import shutil

import pytest

from parley.kernels import native

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="no C++ compiler")


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_changed_or_unrecorded_library_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_NATIVE_DIR", str(tmp_path))
    lib = native.build()
    record = lib.with_name(lib.name + ".sha256")
    good = lib.read_bytes()
    assert record.read_text().strip() == sha256(lib)
    built = lib.stat().st_mtime_ns
    assert native.build() == lib and lib.stat().st_mtime_ns == built  # a match: used as it is, not rebuilt

    lib.write_bytes(good[:-64] + b"\0" * 64)  # changed in the cache folder
    assert native.build() == lib
    assert record.read_text().strip() == sha256(lib)
    assert lib.read_bytes() != good[:-64] + b"\0" * 64

    record.unlink()  # a library without its record is not trusted either
    built_before = lib.stat().st_mtime_ns
    native.build()
    assert record.read_text().strip() == sha256(lib) and lib.stat().st_mtime_ns != built_before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([lib.name, record.name])  # no temporaries left
