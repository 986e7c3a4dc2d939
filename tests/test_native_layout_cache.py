"""The native step's repacked INT4 weights are cached in the AWQ folder and memory-mapped on the next start:
that start packs nothing and computes bitwise the same logits; a damaged or doctored file (bytes, manifest or
tensor shapes) is ignored and repacked, never read; a folder outside the Parley cache is never written to."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from awq_tiny import outlier_model, write_hf_dir
from safetensors.torch import load_file, save_file

from parley.cache_files import file_sha256
from parley.engine.engine import Engine
from parley.kernels import native
from parley.models import native_cache, native_forward

pytestmark = pytest.mark.skipif(native_forward.library() is None,
                                reason=f"native step unavailable: {native_forward.why_unavailable()}")

IDS = list(range(5, 60))


def logits(engine: Engine) -> torch.Tensor:
    engine.reset_cache()
    return engine.forward(IDS)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return str(write_hf_dir(outlier_model(seed=5), tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("layout-cache")


@pytest.fixture(autouse=True)
def _own_cache(cache_dir, monkeypatch):
    """A Parley cache of this file's own: `load` expects one quantized folder in it, and the other tests of
    an xdist worker (the native head's GPTQ, say) quantize into the worker's shared one."""
    monkeypatch.setenv("PARLEY_CACHE_DIR", str(cache_dir))


def load(source: str) -> Engine:
    """The engine a start with `--quant awq` gets; `awq_folder` is where its quantized weights are cached."""
    from parley.models.quantize.cache import awq_root

    engine = Engine.load(source, quant="awq", device="cpu")
    native_cache.wait_for_saves()  # the layout is written on a thread: here as the next start finds it
    (engine.awq_folder,) = [p for p in awq_root().iterdir() if p.is_dir() and not p.name.startswith(".")]
    return engine


def no_packing(monkeypatch) -> None:
    def refuse(*a, **k):
        raise AssertionError("packed again although the cached layout was valid")

    monkeypatch.setattr(native, "pack_q4", refuse)
    monkeypatch.setattr(native, "pack_q8", refuse)


def test_second_start_maps_the_cached_layout_and_computes_the_same(source, monkeypatch):
    first = load(source)
    assert first.step_kind == "native"
    want = logits(first)
    files = sorted(p.name for p in first.awq_folder.glob("native-*"))
    assert len(files) == 2 and files[0].endswith(".json") and files[1].endswith(".safetensors"), files
    with monkeypatch.context() as m:
        no_packing(m)
        second = load(source)
        assert torch.equal(logits(second), want)


@pytest.mark.parametrize("damage", ["bytes", "manifest", "shapes"])
def test_a_damaged_layout_is_ignored_and_repacked(source, monkeypatch, damage):
    engine = load(source)
    want = logits(engine)
    folder = engine.awq_folder
    data = next(folder.glob("native-*.safetensors"))
    manifest = data.with_suffix(".json")
    if damage == "bytes":  # a flipped byte in the middle of a tensor
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    elif damage == "manifest":
        manifest.write_text("{not json")
    else:  # a well-formed file with a consistent manifest, but a tensor of another shape (reads past an end)
        tensors = load_file(str(data))
        name = next(k for k in tensors if k.endswith(".q"))
        tensors[name] = tensors[name][:1].clone()
        save_file(tensors, str(data))
        meta = json.loads(manifest.read_text())
        meta.update(size=data.stat().st_size, sha256=file_sha256(data))
        manifest.write_text(json.dumps(meta))
    again = load(source)
    assert torch.equal(logits(again), want), damage
    key = data.name.removeprefix("native-").removesuffix(".safetensors")
    if damage != "shapes":  # repacked and cached afresh: the next start maps it again
        assert native_cache.load(folder, key) is not None


def test_a_folder_outside_the_parley_cache_is_not_written(source, tmp_path):
    engine = load(source)
    mine = tmp_path / "my-awq"
    shutil.copytree(engine.awq_folder, mine, ignore=shutil.ignore_patterns("native-*"))
    user = Engine.load(str(mine), quant="none", device="cpu")
    assert user.step_kind == "native" and not list(mine.glob("native-*"))
    assert torch.equal(logits(user), logits(engine))


def test_the_rotated_and_the_standard_down_proj_get_their_own_layouts(source, monkeypatch):
    """The folder's rotated down_proj (models/quantize/hadamard.py) packs to another layout than the standard
    one: a start that switches the rotation off must not map the rotated layout."""
    from parley.models.quantize import hadamard

    rotated = load(source)
    assert rotated.model.layers[0].mlp.down_diag is not None
    want = logits(rotated)
    monkeypatch.setenv(hadamard.DISABLE_ENV, "0")
    plain = load(source)
    assert plain.model.layers[0].mlp.down_diag is None
    assert not torch.allclose(logits(plain), want)
    assert len(list(plain.awq_folder.glob("native-*.safetensors"))) == 2
