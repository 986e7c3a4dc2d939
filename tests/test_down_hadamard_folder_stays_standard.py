"""The rotated down_proj (models/quantize/hadamard.py) lives beside a standard folder, never in it:
transformers reads the folder (strict state dict) and computes what Parley computes with the rotation
switched off; Parley's loader swaps the rotated weights in (other logits, as close to the fp model);
a rotated file written for other weights is skipped with a warning, and a damaged one is an error that
names it."""

from __future__ import annotations

import logging

import pytest
import torch
from awq_tiny import logits, outlier_model
from safetensors.torch import load_file, save_file
from test_awq_checkpoint_loads import tokenizer_files
from test_awq_folder_loads_in_transformers import transformers_model

from parley.bench.quality import dequantized
from parley.models.errors import ModelLoadError
from parley.models.loading import load_model
from parley.models.quantize import hadamard
from parley.models.quantize.awq import AWQSettings, awq_quantize
from parley.models.quantize.checkpoint import save_awq
from parley.models.resolve import resolve

SEED = 7


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hd")
    model = outlier_model(seed=SEED, n_kv_heads=4)
    tokens = torch.randint(0, 256, (3, 40), generator=torch.Generator().manual_seed(SEED))
    with torch.no_grad():
        fp = logits(model, tokens)
    report = awq_quantize(model, tokens, AWQSettings(group_size=32, rotate=True, gptq=True, refit_scales=True,
                                                     hadamard_down=64, hadamard_seed=SEED))
    assert report.down_block == 64 and sorted(report.rotated_down) == [0, 1], f"seed {SEED}"
    out = save_awq(model, model.config, tokenizer_files(tmp), tmp / "awq")
    hadamard.save(out, report.rotated_down, report.down_diag, report.down_block)
    return out, tokens, fp


@torch.no_grad()
def test_transformers_reads_the_standard_down_proj(folder, monkeypatch):
    out, tokens, _ = folder
    monkeypatch.setenv(hadamard.DISABLE_ENV, "0")
    plain = load_model(resolve(str(out)))
    assert plain.layers[0].mlp.down_diag is None
    ours, ref = dequantized(plain), transformers_model(out)
    for row in tokens:
        torch.testing.assert_close(ref(row[None]).logits[0], logits(ours, row[None])[0], atol=2e-4, rtol=2e-4,
                                   msg=f"seed {SEED}")


@torch.no_grad()
def test_parley_runs_the_rotated_down_proj(folder, monkeypatch):
    out, tokens, fp = folder
    rotated = load_model(resolve(str(out)))
    assert all(layer.mlp.down_hadamard.shape == (64, 64) and layer.mlp.down_diag is not None
               for layer in rotated.layers)
    monkeypatch.setenv(hadamard.DISABLE_ENV, "0")
    plain = load_model(resolve(str(out)))
    got, standard = logits(dequantized(rotated), tokens), logits(dequantized(plain), tokens)
    assert not torch.allclose(got, standard, atol=1e-3), f"seed {SEED}: the rotated file changed nothing"
    for name, x in (("rotated", got), ("standard", standard)):  # both are INT4 models of the same fp model
        rel = ((x - fp).norm() / fp.norm()).item()
        assert rel < 0.2, f"seed {SEED}: {name} INT4 logits {rel:.3f} off the fp model's"


@torch.no_grad()
def test_a_rotated_file_for_other_weights_is_skipped(folder, tmp_path, caplog):
    out, _, _ = folder
    other = tmp_path / "other"
    other.mkdir()
    for f in out.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(other / "model.safetensors"))  # the same weights re-saved: another sha256
    save_file(tensors, str(other / "model.safetensors"), metadata={"format": "pt", "edited": "yes"})
    with caplog.at_level(logging.WARNING, logger="parley.quantize"):
        model = load_model(resolve(str(other)))
    assert model.layers[0].mlp.down_diag is None
    assert hadamard.FILE in caplog.text and "other weights" in caplog.text


def test_a_damaged_rotated_file_is_an_error_naming_it(folder, tmp_path):
    out, _, _ = folder
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in out.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    data = (broken / hadamard.FILE).read_bytes()
    (broken / hadamard.FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=hadamard.FILE):
        load_model(resolve(str(broken)))
