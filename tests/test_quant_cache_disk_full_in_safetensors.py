"""A disk that fills up inside safetensors' own writer (a SafetensorError, not an OSError) ends in the same
one-line error as ENOSPC anywhere else, with nothing partial kept."""

import pytest
from awq_tiny import outlier_model, write_hf_dir
from safetensors import SafetensorError

from parley.models.errors import ModelLoadError
from parley.models.quantize import cache
from parley.models.quantize.cache import awq_root, ensure_quantized
from parley.models.resolve import resolve

SETTINGS = dict(group_size=32, calib="builtin", n_samples=4, seq_len=32)
RUST_ENOSPC = ('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on '
               'device" })')


@pytest.mark.parametrize(("message", "words"), [
    (RUST_ENOSPC, "No space left on device"),
    (RUST_ENOSPC.replace("28", "122").replace("StorageFull", "FilesystemQuotaExceeded"), "quota"),
])
def test_safetensors_disk_full_is_one_error_and_leaves_nothing(tmp_path, monkeypatch, message, words):
    monkeypatch.setenv("PARLEY_CACHE_DIR", str(tmp_path / "cache"))
    source = resolve(str(write_hf_dir(outlier_model(), tmp_path / "tiny")))
    real_save = cache.save_awq

    def save_then_fill_up(model, config, files, out, *a, **k):
        real_save(model, config, files, out, *a, **k)
        raise SafetensorError(message)

    monkeypatch.setattr(cache, "save_awq", save_then_fill_up)
    with pytest.raises(ModelLoadError, match=rf"cannot write the quantized model \(.*{words}.*\); free some space"):
        ensure_quantized(source, **SETTINGS)
    # nothing partial is kept but the work folder of finished layers, named in the error, for a resume
    assert [p.name for p in awq_root().iterdir() if not p.name.startswith(".work-")] == []


def test_other_safetensors_errors_are_not_disguised(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_CACHE_DIR", str(tmp_path / "cache"))
    source = resolve(str(write_hf_dir(outlier_model(), tmp_path / "tiny")))

    def broken(*a, **k):
        raise SafetensorError("Error while serializing: a tensor is not contiguous")

    monkeypatch.setattr(cache, "save_awq", broken)
    with pytest.raises(SafetensorError):
        ensure_quantized(source, **SETTINGS)
