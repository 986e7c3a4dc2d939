"""The random checkpoints of `bench decode --random` are one set of weights in every format it writes: the bf16
safetensors checkpoint is the same for a fixed seed whatever is asked first, the INT4 folder is its linears
rounded to nearest (the loader's AWQ path reads it), and the BF16 GGUF given to llama-quantize loads back to the
checkpoint's exact tensors and rotary frequencies (llama's q/k rows permuted as convert_hf_to_gguf does,
qwen2's biases kept, llama3 rope scaling stored as `rope_freqs`)."""

import pytest
import torch

from parley.bench import random_weights as rw
from parley.models.loading import load_model
from parley.models.quantize.int4_linear import Int4Linear
from parley.models.resolve import ModelFiles

SMALL = rw.RANDOM_SHAPES["small"]
SHAPES = {
    "t-llama3": {**SMALL, "rope_theta": 500000.0, "rope_scaling": {**rw.LLAMA3_ROPE, "factor": 8.0}},
    "t-qwen2": {**SMALL, "arch": "qwen2", "qkv_bias": True, "n_kv_heads": 1, "norm_eps": 1e-6},
    "t-untied": {**SMALL, "tie_embeddings": False},
}


@pytest.fixture(autouse=True)
def shapes(monkeypatch):
    for name, shape in SHAPES.items():
        monkeypatch.setitem(rw.RANDOM_SHAPES, name, shape)


def _load(path, kind="dir"):
    return load_model(ModelFiles(ref=str(path), kind=kind, path=path))


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_gguf_holds_the_checkpoints_weights(shape, tmp_path):
    src = rw.checkpoint(shape)
    ref = _load(src)
    out = rw.write_gguf(src, rw.shape_config(shape), tmp_path / "bf16.gguf")
    got = _load(out, "gguf")
    a, b = ref.state_dict(), got.state_dict()
    assert set(a) == set(b)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert torch.allclose(ref.inv_freq, got.inv_freq, rtol=1e-6, atol=0)


def test_the_checkpoint_is_fixed_by_the_seed_and_the_int4_folder_is_its_rounding(tmp_path):
    from parley.models.quantize.pack import quantize_weight

    src = rw.checkpoint("t-qwen2")
    first = _load(src).state_dict()
    rw.root("t-qwen2").rename(tmp_path / "old")  # written again from nothing: the same values
    again = _load(rw.checkpoint("t-qwen2")).state_dict()
    assert all(torch.equal(first[k], again[k]) for k in first)
    model = _load(rw.int4_folder("t-qwen2"))
    q = model.layers[1].self_attn.q_proj
    assert isinstance(q, Int4Linear) and q.group_size == 128
    want = quantize_weight(first["layers.1.self_attn.q_proj.weight"], 128)
    assert all(torch.equal(x, y) for x, y in zip((q.qweight, q.qzeros, q.scales), want, strict=True))
    assert torch.equal(q.bias, first["layers.1.self_attn.q_proj.bias"].half().float())
