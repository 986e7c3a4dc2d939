"""On the CPU an INT4 model's linears hold no copy of their weights beside the native step's packed one: the loader
leaves them on the meta device with a reader of the checkpoint (`Int4Linear.read_on_use`). What uses them reads
them then and gets exactly the loaded tensors; the native step packs from them and lets go; a file damaged after
the load is a one-line error naming it, never other weights. The embedding stays as stored (fp16), widened
exactly where a row is looked up."""

from __future__ import annotations

import torch
from awq_tiny import outlier_model
from real_engines import int4_path, loaded
from test_awq_checkpoint_loads import fp16_rounded, tokenizer_files

from parley.engine.engine import Engine
from parley.engine.params import GenerationParams
from parley.models.errors import ModelLoadError
from parley.models.loading import load_model
from parley.models.native_step import NativeStep
from parley.models.quantize.awq import AWQSettings, awq_quantize
from parley.models.quantize.checkpoint import save_awq
from parley.models.quantize.int4_linear import Int4Linear, decoder_linears
from parley.models.resolve import resolve

SEED = 0


def int4_folder(tmp_path):
    model = outlier_model(qkv_bias=True)
    tokens = torch.randint(0, 256, (3, 40), generator=torch.Generator().manual_seed(SEED))
    awq_quantize(model, tokens, AWQSettings(group_size=64))
    fp16_rounded(model)
    return save_awq(model, model.config, tokenizer_files(tmp_path), tmp_path / "awq")


def held(lin: Int4Linear) -> dict[str, torch.Tensor]:
    return {k: t for k, t in lin._buffers.items() if k in Int4Linear.ON_USE and t is not None}


def test_the_default_engine_holds_no_module_copy_and_replies():
    # loaded afresh (not the tests' shared engine, whose modules other tests' references read)
    engine = Engine.load(int4_path(), device="cpu",
                         context_window=256)
    assert engine.native is not None
    lins = [lin for _, _, lin in decoder_linears(engine.model)]
    assert lins and all(isinstance(lin, Int4Linear) for lin in lins)
    assert all(t.is_meta for lin in lins for t in held(lin).values()), "a module holds a second copy"
    assert engine.model.embed_tokens.weight.dtype == torch.float16, "the embedding was widened to fp32"
    ask = [{"role": "user", "content": "What is the capital of France?"}]
    params = GenerationParams(temperature=0, max_new_tokens=12, speculation="off")
    text = "".join(getattr(e, "text", "") for e in engine.session().reply(ask, params))
    # The tests' INT4 folder comes from a tiny calibration, and its weights from this CPU's float rounding: its
    # greedy answer says "Paris" on most machines, "Bienvenue, the capital of France!" on an Intel Xeon with
    # AMX quantizing on one thread. So: on topic, and the text the tests' shared engine (the same folder, its
    # modules read by other tests) gives.
    assert "France" in text or "Paris" in text, text
    shared = "".join(getattr(e, "text", "") for e in loaded("awq").session().reply(ask, params))
    assert text == shared, (text, shared)
    assert all(t.is_meta for lin in lins for t in held(lin).values()), "a reply read the modules' weights"


@torch.no_grad()
def test_read_on_use_gives_the_loaded_tensors_and_the_same_packed_step(tmp_path):
    files = resolve(str(int4_folder(tmp_path)))
    eager = load_model(files)
    lazy = load_model(files, int4_on_use=True)
    pairs = list(zip(decoder_linears(eager), decoder_linears(lazy), strict=True))
    assert all(t.is_meta for _, _, lin in decoder_linears(lazy) for t in held(lin).values())
    assert not eager.config.tie_embeddings and lazy.lm_head._parameters["weight"].is_meta  # the untied head too
    # the embedding as stored (fp16), not doubled into fp32: widened row by row, the same values
    assert eager.embed_tokens.weight.dtype == torch.float32 and lazy.embed_tokens.weight.dtype == torch.float16
    ids = torch.arange(0, 256, 7)[None]
    assert lazy.embed(ids).dtype == torch.float32 and torch.equal(lazy.embed(ids), eager.embed(ids))
    x = torch.randn(3, pairs[0][0][2].in_features, generator=torch.Generator().manual_seed(SEED))
    (_, _, e0), (_, _, l0) = pairs[0]
    assert torch.equal(l0(x), e0(x))  # the PyTorch path reads the tensors on its first use
    assert all(not t.is_meta for t in held(l0).values())
    l0.release()
    assert all(t.is_meta for t in held(l0).values())

    step_e = NativeStep.for_model(eager)
    step_l = NativeStep.for_model(lazy)  # packs every linear from what it reads, then lets go
    for (_, name, e), (_, _, lz) in pairs:
        assert all(t.is_meta for t in held(lz).values()), name
        for k, t in held(e).items():  # read again on use: the same tensors
            assert torch.equal(getattr(lz, k), t), (name, k)
    assert lazy.lm_head._parameters["weight"].is_meta  # packed as int8, then let go
    assert torch.equal(lazy.lm_head.weight, eager.lm_head.weight)  # read again: the loaded fp32 head
    tokens = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(SEED))
    pos = torch.arange(9)[None]
    want = step_e(tokens, pos, eager.new_cache(64))
    assert torch.equal(step_l(tokens, pos, lazy.new_cache(64)), want)


def test_a_file_damaged_after_the_load_is_one_error_naming_it(tmp_path):
    out = int4_folder(tmp_path)
    lazy = load_model(resolve(str(out)), int4_on_use=True)
    (out / "model.safetensors").write_bytes(b"\x00" * 64)
    lin = decoder_linears(lazy)[0][2]
    try:
        lin.qweight  # noqa: B018 (the read is the point)
    except ModelLoadError as e:
        assert "model.safetensors" in str(e) and "load the model again" in str(e), e
    else:
        raise AssertionError("a damaged checkpoint was read as weights")


def test_values_read_on_use_are_checked_as_at_load(tmp_path):
    """A NaN scale is refused when it is read, as the eager loader refuses it at load."""
    from safetensors.torch import load_file, save_file

    out = int4_folder(tmp_path)
    tensors = load_file(out / "model.safetensors")
    name = next(k for k in tensors if k.endswith("layers.0.mlp.up_proj.scales"))
    tensors[name][0, 0] = float("nan")
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    lazy = load_model(resolve(str(out)), int4_on_use=True)  # nothing of the linears is read yet
    up = lazy.layers[0].mlp.up_proj
    try:
        up.scales  # noqa: B018
    except ModelLoadError as e:
        assert "up_proj.scales" in str(e) and "NaN" in str(e), e
    else:
        raise AssertionError("a NaN scale was read as a weight")
