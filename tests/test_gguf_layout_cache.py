"""`--quant gguf` on the CPU caches the native step's packed layout in the Parley cache, keyed by the file's
sha256: the next start packs nothing and computes bitwise the same logits; a file changed in place gets a
layout of its own (never the stale one, which is removed when the new one is saved); the folder holding the
user's file is never written to."""

from __future__ import annotations

import gguf
import pytest
import torch
from tiny_models import reference_model, tiny_config, write_gguf

from parley.engine.engine import Engine
from parley.kernels import native
from parley.models import native_cache, native_forward
from parley.models.resolve import resolve

pytestmark = pytest.mark.skipif(native_forward.library() is None,
                                reason=f"native step unavailable: {native_forward.why_unavailable()}")

IDS = list(range(5, 60))


def tiny_gguf(path, seed: int):
    config = tiny_config()  # untied: the file's own output.weight is packed to int8 rows
    config["intermediate_size"] = 128
    return write_gguf(path, reference_model(config, seed=seed), config, linears_as=gguf.GGMLQuantizationType.Q4_1)


def logits(path) -> torch.Tensor:
    engine = Engine.load(str(path), quant="gguf", device="cpu")
    assert engine.step_kind == "native"
    engine.reset_cache()
    return engine.forward(IDS)


def no_packing(monkeypatch) -> None:
    def refuse(*a, **k):
        raise AssertionError("packed again although the cached layout was valid")

    for name in ("pack_q4", "pack_q4_rows", "pack_q8"):
        monkeypatch.setattr(native, name, refuse)


def layouts(path) -> list[str]:
    return sorted(p.name for p in native_cache.gguf_place(resolve(str(path))).folder.glob("native-*"))


def test_second_start_reads_the_cached_layout_and_computes_the_same(tmp_path, monkeypatch):
    mine = tmp_path / "models"
    mine.mkdir()
    path = tiny_gguf(mine / "tiny.gguf", seed=3)
    want = logits(path)
    assert len(layouts(path)) == 2  # the packed tensors and their manifest
    with monkeypatch.context() as m:
        no_packing(m)
        assert torch.equal(logits(path), want)
    assert [p.name for p in mine.iterdir()] == ["tiny.gguf"], "wrote beside the user's file"


def test_a_file_changed_in_place_gets_its_own_layout(tmp_path, monkeypatch):
    path = tiny_gguf(tmp_path / "tiny.gguf", seed=3)
    old = logits(path)
    stale = layouts(path)
    tiny_gguf(path, seed=4)  # other weights under the same name
    new = logits(path)
    assert not torch.allclose(new, old)
    assert torch.equal(new, logits(tiny_gguf(tmp_path / "fresh.gguf", seed=4)))
    assert len(layouts(path)) == 2 and not set(layouts(path)) & set(stale), "the stale layout was kept"
    with monkeypatch.context() as m:
        no_packing(m)
        assert torch.equal(logits(path), new)
