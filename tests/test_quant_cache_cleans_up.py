"""Quantization leaves nothing half-made behind: a full disk ends in one ModelLoadError with no partial
folder (the finished layers stay in the work folder, named, for the next run to resume from), Ctrl-C removes
the build's temporary folder, and a dead builder's temporary folder goes at the start of the next call -- even
one that only loads a cached model."""

import errno

import pytest
from awq_tiny import outlier_model, write_hf_dir

from parley.models.errors import ModelLoadError
from parley.models.quantize import cache, stream
from parley.models.quantize.cache import awq_root, ensure_quantized
from parley.models.resolve import resolve

SETTINGS = dict(group_size=32, calib="builtin", n_samples=4, seq_len=32)


@pytest.fixture
def source(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_CACHE_DIR", str(tmp_path / "cache"))  # a cache of its own: other tests fill theirs
    return resolve(str(write_hf_dir(outlier_model(), tmp_path / "tiny")))


def leftovers():
    return sorted(p.name for p in awq_root().iterdir()) if awq_root().exists() else []


def test_full_disk_is_one_error_and_leaves_nothing(source, monkeypatch):
    real_save = cache.save_awq

    def save_then_fill_up(model, config, files, out, *a, **k):
        real_save(model, config, files, out, *a, **k)  # half the folder is written...
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "model.safetensors"))

    monkeypatch.setattr(cache, "save_awq", save_then_fill_up)
    with pytest.raises(ModelLoadError, match=r"awq: cannot write the quantized model \(No space left on device\); "
                                             r"free some space.*PARLEY_CACHE_DIR.*nothing partial was kept; the "
                                             r"layers already done \(\d+ MB in .*\.work-.*\) are kept"):
        ensure_quantized(source, **SETTINGS)
    assert [p for p in leftovers() if not p.startswith(".work-")] == []


def test_ctrl_c_removes_the_temporary_folder(source, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(stream, "quantize_layers", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ensure_quantized(source, **SETTINGS)
    assert leftovers() == []


def test_dead_builders_temporary_folder_goes_on_the_next_load(source):
    out = ensure_quantized(source, **SETTINGS)
    dead = awq_root() / f".tmp-{out.path.name}.pid999999999.abcd"  # no such process
    dead.mkdir()
    (dead / "model.safetensors").write_bytes(b"half")
    alive = awq_root() / f".tmp-{out.path.name}.pid1.abcd"  # pid 1 is alive: a build in progress, kept
    alive.mkdir()
    assert ensure_quantized(source, **SETTINGS).path == out.path  # a cache hit, no build
    assert leftovers() == sorted([alive.name, out.path.name])
