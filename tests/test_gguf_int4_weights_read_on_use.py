"""`--quant gguf` on the CPU: the decoder's INT4 tensors and an untied head are decoded from the mapped GGUF when
first used (models/read_on_use.py), not at load, so the native step's packed copy is the only one held. What is
read is exactly what an eager load imports, the native step's logits are bitwise the same, and a damaged block
is refused when it is read, as the eager load refuses it."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from tiny_models import reference_model, tiny_config, write_gguf

from parley.kernels import native
from parley.models.errors import ModelLoadError
from parley.models.gguf_int4 import Imported
from parley.models.gguf_weights import open_gguf
from parley.models.loading import load_model
from parley.models.native_step import NativeStep
from parley.models.quantize.int4_linear import Int4Linear, decoder_linears
from parley.models.resolve import resolve

T = gguf.GGMLQuantizationType
SEED = 7


def tiny_gguf(tmp_path, kind: T, linear_kinds: dict[str, T] | None = None):
    config = tiny_config()  # untied: the file has its own output.weight
    config["intermediate_size"] = 128  # every linear's inputs a multiple of 32
    return write_gguf(tmp_path / f"tiny-{kind.name}.gguf", reference_model(config, seed=SEED), config,
                      linears_as=kind, linear_kinds=linear_kinds)


MIXED = {"k_proj": T.Q8_0, "up_proj": T.Q5_0}  # rounded to INT4 on import, fused beside the file's own Q4_1


def held(lin: Int4Linear) -> dict[str, torch.Tensor]:
    return {k: t for k, t in lin._buffers.items() if k in Int4Linear.ON_USE and t is not None}


@pytest.mark.parametrize(("kind", "mixed"), [(T.Q4_0, None), (T.Q4_1, None), (T.Q4_1, MIXED)])
@torch.no_grad()
def test_read_on_use_gives_the_imported_tensors_and_the_same_native_logits(tmp_path, kind: T, mixed,
                                                                          monkeypatch) -> None:
    """The eager load packs the AWQ tensors it imported; the lazy one packs the integers read row by row from
    the file (`Int4Linear.q4_rows`, no AWQ round trip), and the head from row blocks read one at a time: the same
    logits, bit for bit."""
    monkeypatch.setattr(native, "Q8_ROWS", 48)  # the tiny head's 259 rows in six blocks, the last one short
    files = resolve(str(tiny_gguf(tmp_path, kind, mixed)))
    eager = load_model(files, gguf_int4=Imported())
    lazy = load_model(files, gguf_int4=Imported(), int4_on_use=True)
    pairs = list(zip(decoder_linears(eager), decoder_linears(lazy), strict=True))
    assert all(t.is_meta for _, _, lin in decoder_linears(lazy) for t in held(lin).values())
    assert lazy.lm_head._parameters["weight"].is_meta, "the untied head was decoded at load"
    assert (lazy.layers[0].mlp.gate_proj._buffers.get("mins") is not None) == (kind == T.Q4_1)
    assert (lazy.layers[0].mlp.up_proj._buffers.get("mins") is not None) == (kind == T.Q4_1 and not mixed)

    tokens = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(SEED))
    pos = torch.arange(9)[None]
    module_logits = eager(tokens, pos, eager.new_cache(64))  # the PyTorch path: each Int4Linear's own weight
    step_e = NativeStep.for_model(eager, head_bits=8)
    step_l = NativeStep.for_model(lazy, head_bits=8)  # decodes each linear as it packs it, then lets go
    for (_, name, e), (_, _, lz) in pairs:
        assert all(t.is_meta for t in held(lz).values()), name
        for k, t in held(e).items():  # decoded again on use: the same tensors
            assert torch.equal(getattr(lz, k), t), (name, k)
    assert lazy.lm_head._parameters["weight"].is_meta
    assert torch.equal(lazy.lm_head.weight, eager.lm_head.weight)
    want = step_e(tokens, pos, eager.new_cache(64))
    assert torch.equal(step_l(tokens, pos, lazy.new_cache(64)), want)
    # and both follow the modules (8-bit activations: ~1% of the logits' range apart; a dropped minimum: ~150%)
    assert (want - module_logits).abs().max() < 0.05 * module_logits.abs().max()


def test_a_nan_scale_is_refused_when_it_is_read(tmp_path) -> None:
    path = tiny_gguf(tmp_path, T.Q4_0)
    block = next(t for t in open_gguf(path).tensors if t.name == "blk.1.ffn_up.weight").data[0, :18].tobytes()
    raw = bytearray(path.read_bytes())
    at = raw.find(block)
    assert at > 0 and raw.find(block, at + 1) < 0, "the block is not unique in the file"
    raw[at : at + 2] = np.array([np.nan], dtype=np.float16).tobytes()  # the block's scale d
    path.write_bytes(bytes(raw))
    with pytest.raises(ModelLoadError, match="NaN"):
        load_model(resolve(str(path)), gguf_int4=Imported())  # the eager load refuses it
    lazy = load_model(resolve(str(path)), gguf_int4=Imported(), int4_on_use=True)  # nothing decoded yet
    with pytest.raises(ModelLoadError, match=r"layers\.1\.mlp\.up_proj\.scales.*NaN"):
        lazy.layers[1].mlp.up_proj.scales  # noqa: B018 (the read is the point)


def test_a_nan_scale_is_refused_when_the_native_step_packs_it(tmp_path) -> None:
    """The packer reads the file's integers row by row, not the module's tensors: that read is checked too,
    and a damaged file is an error at load, not a quiet fall back to the PyTorch path."""
    path = tiny_gguf(tmp_path, T.Q4_0)
    block = next(t for t in open_gguf(path).tensors if t.name == "blk.1.ffn_up.weight").data[0, :18].tobytes()
    raw = bytearray(path.read_bytes())
    at = raw.find(block)
    assert at > 0 and raw.find(block, at + 1) < 0, "the block is not unique in the file"
    raw[at : at + 2] = np.array([np.nan], dtype=np.float16).tobytes()
    path.write_bytes(bytes(raw))
    lazy = load_model(resolve(str(path)), gguf_int4=Imported(), int4_on_use=True)
    with pytest.raises(ModelLoadError, match=r"layers\.1\.mlp\.up_proj\.scales.*NaN"):
        NativeStep.for_model(lazy, head_bits=8)


def test_a_nan_in_the_head_is_refused_when_its_row_block_is_packed(tmp_path) -> None:
    """The int8 head is packed from row blocks read one at a time: each block is checked as the whole weight
    would be."""
    path = tiny_gguf(tmp_path, T.Q4_0)
    head = next(t for t in open_gguf(path).tensors if t.name == "output.weight")
    assert head.kind == T.F32
    row = head.data[200].tobytes()
    raw = bytearray(path.read_bytes())
    at = raw.find(row)
    assert at > 0 and raw.find(row, at + 1) < 0, "the row is not unique in the file"
    raw[at + 4 * 7 : at + 4 * 8] = np.array([np.nan], dtype=np.float32).tobytes()
    path.write_bytes(bytes(raw))
    lazy = load_model(resolve(str(path)), gguf_int4=Imported(), int4_on_use=True)
    with pytest.raises(ModelLoadError, match=r"lm_head\.weight.*NaN"):
        NativeStep.for_model(lazy, head_bits=8)
