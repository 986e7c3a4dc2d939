"""The first-run quantizer walks the checkpoint one layer at a time (stream.py) and still computes what the
whole-model quantizer computes: on a tiny model the folder's integers, zero points and scales are bitwise those
of `awq_quantize` on the whole fp model with the same settings, no fp layer outlives its turn, and the fp model
is never loaded whole."""

import gc
import weakref

import pytest
import torch
from awq_tiny import outlier_model, write_hf_dir
from safetensors import safe_open

from parley.models import loading
from parley.models.quantize import cache, methods, stream
from parley.models.quantize.awq import awq_quantize
from parley.models.quantize.calibration import load_calibration
from parley.models.resolve import resolve
from parley.models.tokenizer import load_tokenizer

SETTINGS = dict(group_size=32, calib="builtin", n_samples=4, seq_len=32)


@pytest.fixture
def source(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_CACHE_DIR", str(tmp_path / "cache"))
    return resolve(str(write_hf_dir(outlier_model(layers=2), tmp_path / "tiny")))


def tensors(path):
    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118


@pytest.mark.parametrize("tier", ["gptq", "awq"])
def test_streamed_folder_equals_the_whole_model_quantization(source, tier, monkeypatch):
    live: list[weakref.ref] = []
    most = [0]
    real_read = stream.read_block

    def counting_read(*a, **k):
        block = real_read(*a, **k)
        gc.collect()
        alive = [r for r in live if r() is not None and any(
            isinstance(m, torch.nn.Linear) for m in r().modules())]
        most[0] = max(most[0], len(alive) + 1)
        live.append(weakref.ref(block))
        return block

    monkeypatch.setattr(stream, "read_block", counting_read)
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the fp model was loaded whole"))
    out = cache.ensure_quantized(source, method=tier, **SETTINGS)
    assert most[0] == 1, f"{most[0]} fp layers were alive at once"

    # The reference: the whole fp model, quantized in place by the same settings on the same calibration.
    monkeypatch.undo()
    model = loading.load_model(source)
    settings = methods.tier_settings(tier, 32, torch.device("cpu"))
    tok = load_tokenizer(source)
    calibration = load_calibration(tok.encode, 4, 32, "builtin")
    report = awq_quantize(model, calibration.tokens, settings)
    assert report.rotated
    got = tensors(out.path / "model.safetensors")
    compared = 0
    for name, t in model.state_dict().items():
        if name.endswith((".qweight", ".qzeros", ".scales")):
            mine = got[f"model.{name}"]
            assert torch.equal(mine, t), f"{name} differs from the whole-model quantization"
            compared += 1
    assert compared == 2 * 7 * 3
    rotated = tensors(out.path / "parley-down-hadamard.safetensors")
    for i, lin in report.rotated_down.items():
        assert torch.equal(rotated[f"layers.{i}.mlp.down_proj.qweight"], lin.qweight)
    assert not stream.work_folder(out.path).exists()  # the work folder goes once the folder is in place
