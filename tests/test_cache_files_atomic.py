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
