"""Every packed output head (the int8 rows and the 4-bit head, forced here by PARLEY_HEAD_BITS) is cached with the
rest of the native layout, one file per head width: the next start packs no head and computes bitwise the
same logits; a cached head whose bytes were changed or cut off is detected and repacked, never read."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from awq_tiny import outlier_model, write_hf_dir

from parley.engine.engine import Engine
from parley.kernels import native
from parley.models import native_cache, native_forward
from parley.models.native_step import NativeStep
from parley.models.quantize import hadamard, head4

pytestmark = pytest.mark.skipif(native_forward.library() is None,
                                reason=f"native step unavailable: {native_forward.why_unavailable()}")

IDS = list(range(5, 60))


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The tiny model, and a Parley cache of its own (so its AWQ folder is the only one there)."""
    return (str(write_hf_dir(outlier_model(seed=7), tmp_path_factory.mktemp("tiny") / "model")),
            str(tmp_path_factory.mktemp("head-cache")))


def start(source: tuple[str, str], bits: int, monkeypatch) -> tuple[Engine, torch.Tensor]:
    monkeypatch.setenv("PARLEY_CACHE_DIR", source[1])
    monkeypatch.setenv("PARLEY_HEAD_BITS", str(bits))
    engine = Engine.load(source[0], quant="awq", device="cpu")
    assert engine.step_kind == "native" and engine.native.head_bits == bits
    engine.reset_cache()
    return engine, engine.forward(IDS)


def layout(bits: int) -> tuple:
    """(folder, key, data file) of the cached layout with a `bits` head."""
    from parley.models.quantize.cache import awq_root

    native_cache.wait_for_saves()  # the layout is written on a thread (native_cache.save_later)
    (folder,) = [p for p in awq_root().iterdir() if p.is_dir() and not p.name.startswith(".")]
    head = "gptq" if bits == 4 else ""  # an engine's 4-bit head: GPTQ
    key = native_cache.cache_key(native_cache.awq_place(folder), bits, head,
                                 rotated_down=(folder / hadamard.FILE).is_file())
    return folder, key, folder / f"native-{key}.safetensors"


def head_span(path) -> tuple[int, int]:
    """Byte range of the packed head's weights (`head.q`) in the cached file."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    start, end = json.loads(raw[8 : 8 + n])["head.q"]["data_offsets"]
    return 8 + n + start, 8 + n + end


def refuse_head_packing(monkeypatch) -> None:
    def refuse(*a, **k):
        raise AssertionError("the head was packed again although the cached layout was valid")

    monkeypatch.setattr(native, "pack_q8", refuse)
    monkeypatch.setattr(NativeStep, "_q4_head", staticmethod(refuse))
    monkeypatch.setattr(head4, "head_calibration", refuse)


@pytest.mark.parametrize("bits", [8, 4])
def test_the_next_start_maps_the_cached_head(source, monkeypatch, bits):
    _, want = start(source, bits, monkeypatch)
    folder, key, data = layout(bits)
    assert data.is_file() and "head.q" in native_cache.load(folder, key)
    with monkeypatch.context() as m:
        refuse_head_packing(m)
        assert torch.equal(start(source, bits, monkeypatch)[1], want), f"head bits {bits}"


def test_each_head_width_has_its_own_file(source, monkeypatch):
    start(source, 8, monkeypatch)
    start(source, 4, monkeypatch)
    assert layout(8)[1] != layout(4)[1] and layout(8)[2].is_file() and layout(4)[2].is_file()


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
@pytest.mark.parametrize("bits", [8, 4])
def test_a_damaged_cached_head_is_repacked(source, monkeypatch, bits, damage):
    _, want = start(source, bits, monkeypatch)
    folder, key, data = layout(bits)
    lo, hi = head_span(data)
    raw = bytearray(data.read_bytes())
    if damage == "flipped":  # one weight byte of the head changed: a well-formed file of the right size
        for i in range(lo, hi, max(1, (hi - lo) // 64)):
            raw[i] ^= 0x5A
        data.write_bytes(bytes(raw))
    else:  # cut inside the head
        data.write_bytes(bytes(raw[: (lo + hi) // 2]))
    assert native_cache.load(folder, key) is None, damage
    assert torch.equal(start(source, bits, monkeypatch)[1], want), f"{damage}, head bits {bits}"
    assert native_cache.load(folder, key) is not None  # repacked and cached afresh
