"""The one way a cache file is written (parley.cache_files): whole or not at all, nothing left behind on a failure,
and the cache folder where PARLEY_CACHE_DIR says."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from parley import cache_files


def test_the_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_CACHE_DIR", str(tmp_path / "c"))
    assert cache_files.cache_root() == tmp_path / "c"
    assert cache_files.cache_dir("native") == tmp_path / "c" / "native"


def test_writes_replace_whole_and_leave_no_temporary(tmp_path):
    path = tmp_path / "x.json"
    cache_files.write_json_atomic(path, {"a": 1})
    cache_files.write_json_atomic(path, {"a": 2}, indent=2, sort_keys=True)
    assert json.loads(path.read_text()) == {"a": 2}
    digest = cache_files.save_safetensors_atomic(tmp_path / "t.safetensors", {"w": torch.arange(4.0)})
    assert digest == cache_files.file_sha256(tmp_path / "t.safetensors")
    assert torch.equal(load_file(tmp_path / "t.safetensors")["w"], torch.arange(4.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.safetensors", "x.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "x.json"
    cache_files.write_text_atomic(path, "old")
    with pytest.raises(TypeError):
        cache_files.write_json_atomic(path, {"a": object()})  # fails before anything is written
    with pytest.raises(KeyboardInterrupt), cache_files.replacing(path) as tmp:
        tmp.write_text("half")
        raise KeyboardInterrupt
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_replacing_a_folder(tmp_path):
    out = tmp_path / "model"
    for n in (1, 2):
        with cache_files.replacing(out) as tmp:
            tmp.mkdir()
            (tmp / "config.json").write_text(str(n))
    assert (out / "config.json").read_text() == "2" and [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_safetensors_file_written_here_is_what_the_library_reads(tmp_path, monkeypatch):
    """Every dtype a cache holds, mixed item sizes (each tensor must start aligned, with no gap), a scalar, an
    empty tensor, a non-contiguous view and metadata; written in pieces smaller than the tensors."""
    from safetensors import safe_open

    monkeypatch.setattr(cache_files, "_pieces", lambda view, size, real=cache_files._pieces: real(view, 7))
    g = torch.Generator().manual_seed(0)
    tensors = {
        "q": torch.randint(0, 256, (5, 3), dtype=torch.uint8, generator=g),
        "s16": torch.randn(3, 2, generator=g).half(),
        "b": torch.randn(7, generator=g).bfloat16(),
        "w": torch.randn(4, 6, generator=g).t(),
        "d": torch.randn(3, generator=g, dtype=torch.float64),
        "i": torch.randint(-9, 9, (2, 2), dtype=torch.int64, generator=g),
        "k": torch.randint(-9, 9, (3,), dtype=torch.int32, generator=g),
        "h": torch.randint(-9, 9, (3,), dtype=torch.int16, generator=g),
        "c": torch.randint(-9, 9, (3,), dtype=torch.int8, generator=g),
        "m": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
    }
    path = tmp_path / "t.safetensors"
    digest = cache_files.save_safetensors_atomic(path, tensors, metadata={"format": "7"})
    assert digest == cache_files.file_sha256(path)
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"format": "7"} and set(f.keys()) == set(tensors)
        for name, t in tensors.items():
            got = f.get_tensor(name)
            assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t), name
    # each tensor aligned in the file (what a reader that maps it in place, native_cache's, requires)
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    for name, t in tensors.items():
        assert (8 + n + header[name]["data_offsets"][0]) % t.element_size() == 0, name
    assert [p.name for p in tmp_path.iterdir()] == ["t.safetensors"]
