"""The native library is loaded only if it matches the SHA-256 recorded when it was built: one changed or
damaged in the cache folder (or without a record) is rebuilt, never run. And it is keyed by everything it is
built from: a change to a header the main source includes is a new library.

The build machinery takes any main source (the library's is models/native_forward.cpp): a tiny one here."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from parley.kernels import native

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="no C++ compiler")


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tiny_source(folder: Path) -> Path:
    """A main source that includes a header from another folder, as models/native_forward.cpp includes the kernels."""
    (folder / "kernels").mkdir(parents=True)
    (folder / "kernels" / "one.h").write_text("#pragma once\nstatic int one() { return 1; }\n")
    (folder / "models").mkdir()
    main = folder / "models" / "main.cpp"
    main.write_text('#include "../kernels/one.h"\nextern "C" int parley_one(void) { return one(); }\n')
    return main


def test_a_changed_or_unrecorded_library_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_NATIVE_DIR", str(tmp_path / "lib"))
    source = tiny_source(tmp_path / "src")
    lib = native.build(source)
    record = lib.with_name(lib.name + ".sha256")
    good = lib.read_bytes()
    assert record.read_text().strip() == sha256(lib)
    built = lib.stat().st_mtime_ns
    assert native.build(source) == lib and lib.stat().st_mtime_ns == built  # a match: used as it is, not rebuilt

    lib.write_bytes(good[:-64] + b"\0" * 64)  # changed in the cache folder
    assert native.build(source) == lib
    assert record.read_text().strip() == sha256(lib)
    assert lib.read_bytes() != good[:-64] + b"\0" * 64

    record.unlink()  # a library without its record is not trusted either
    built_before = lib.stat().st_mtime_ns
    native.build(source)
    assert record.read_text().strip() == sha256(lib) and lib.stat().st_mtime_ns != built_before
    assert sorted(p.name for p in lib.parent.iterdir()) == sorted([lib.name, record.name])  # no temporaries left


def test_the_key_covers_the_included_headers(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_NATIVE_DIR", str(tmp_path / "lib"))
    source = tiny_source(tmp_path / "src")
    header = tmp_path / "src" / "kernels" / "one.h"
    assert native.sources(source) == [source.resolve(), header.resolve()]
    before = native.library_path(source)
    header.write_text(header.read_text().replace("return 1", "return 2"))
    assert native.library_path(source) != before
