"""A first run killed mid-quantization resumes from its last finished layer, and never trusts a partial result:
`parley quantize` killed with SIGKILL once a layer is done starts the next run after that layer, and the folder
it finishes is bitwise the one an uninterrupted run builds; a damaged or half-written layer file is redone."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from awq_tiny import outlier_model, write_hf_dir
from safetensors import safe_open

from parley.models.quantize import cache, stream
from parley.models.resolve import resolve

SETTINGS = dict(group_size=32, calib="builtin", n_samples=4, seq_len=32)
LAYERS = 4


def tensors(path):
    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The tiny model, and the folder an uninterrupted run builds from it (in a cache of its own)."""
    root = tmp_path_factory.mktemp("resume")
    source = resolve(str(write_hf_dir(outlier_model(layers=LAYERS), root / "tiny")))
    with pytest.MonkeyPatch.context() as m:
        m.setenv("PARLEY_CACHE_DIR", str(root / "reference"))
        out = cache.ensure_quantized(source, method="gptq", **SETTINGS)
    return source, tensors(out.path / "model.safetensors")


@pytest.fixture
def source(built, tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_CACHE_DIR", str(tmp_path / "cache"))  # each test's cache starts empty
    return built[0]


@pytest.fixture
def reference(built):
    return built[1]


def layers_read(monkeypatch):
    seen = []
    real = stream.read_block
    monkeypatch.setattr(stream, "read_block", lambda src, cfg, i, dtype: seen.append(i) or real(src, cfg, i, dtype))
    return seen


def layers_in_state() -> int:
    for work in cache.awq_root().glob(".work-*"):
        try:
            return json.loads((work / "state.json").read_text())["layers_done"]
        except (OSError, ValueError, KeyError):
            return 0
    return 0


def test_sigkill_after_a_layer_resumes_there(source, reference, tmp_path, monkeypatch):
    cmd = [sys.executable, "-m", "parley.app.cli", "quantize", str(source.path), "--method", "gptq",
           "--group-size", "32", "--calib", "builtin", "--samples", "4", "--seq-len", "32"]
    env = {**os.environ, "PARLEY_THREADS": "1"}
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env)
    try:
        while layers_in_state() < 2:  # poll the work folder until two layers are done (no fixed delay)
            assert proc.poll() is None, "quantize ended before two layers were done"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    work = [p for p in cache.awq_root().iterdir() if p.name.startswith(".work-")]
    assert len(work) == 1
    state, why = stream.resume_state(work[0], json.loads((work[0] / "state.json").read_text())["key"])
    assert state.layers_done >= 2, why
    done = state.layers_done
    read = layers_read(monkeypatch)
    out = cache.ensure_quantized(source, method="gptq", **SETTINGS)
    assert read == list(range(done, LAYERS)), f"resumed at {read}, {done} layers were done"
    got = tensors(out.path / "model.safetensors")
    assert got.keys() == reference.keys()
    for name, t in reference.items():
        assert torch.equal(got[name], t), f"{name}: the resumed folder differs from an uninterrupted one"
    manifest = json.loads((out.path / "manifest.json").read_text())
    assert manifest["timing"]["resumed_after_layer"] == done
    assert not work[0].exists()


def interrupted_after(monkeypatch, layers: int):
    """Make the walk stop (as Ctrl-C does) once `layers` layers are written."""
    real = stream.WorkState.save

    def save(self, folder):
        real(self, folder)
        if self.layers_done >= layers:
            raise KeyboardInterrupt

    monkeypatch.setattr(stream.WorkState, "save", save)


def test_a_damaged_layer_file_is_not_trusted(source, reference, monkeypatch):
    with monkeypatch.context() as m:
        interrupted_after(m, 3)
        with pytest.raises(KeyboardInterrupt):
            cache.ensure_quantized(source, method="gptq", **SETTINGS)
    work = next(p for p in cache.awq_root().iterdir() if p.name.startswith(".work-"))
    damaged = work / stream.layer_file(1)
    data = bytearray(damaged.read_bytes())
    data[-5] ^= 0xFF  # one flipped byte in a finished layer's tensors
    damaged.write_bytes(bytes(data))
    read = layers_read(monkeypatch)
    out = cache.ensure_quantized(source, method="gptq", **SETTINGS)
    assert read == list(range(LAYERS)), "a layer file that fails its sha256 must send the walk back to the start"
    got = tensors(out.path / "model.safetensors")
    assert all(torch.equal(got[k], t) for k, t in reference.items())


def test_a_half_written_layer_is_redone(source, reference, monkeypatch):
    """Killed while a layer's file is being written: the state never named it, so that layer is done again."""
    real = stream.save_safetensors_atomic
    calls = []

    def dies_writing_layer_2(path, tensors_):
        if path.name == stream.layer_file(2) and not calls:
            calls.append(path)
            path.with_name(f".{path.name}.part").write_bytes(b"half a file")
            raise KeyboardInterrupt
        return real(path, tensors_)

    with monkeypatch.context() as m:
        m.setattr(stream, "save_safetensors_atomic", dies_writing_layer_2)
        with pytest.raises(KeyboardInterrupt):
            cache.ensure_quantized(source, method="gptq", **SETTINGS)
    read = layers_read(monkeypatch)
    out = cache.ensure_quantized(source, method="gptq", **SETTINGS)
    assert read == [2, 3]
    got = tensors(out.path / "model.safetensors")
    assert all(torch.equal(got[k], t) for k, t in reference.items())


def test_a_state_for_other_settings_is_not_resumed(source, monkeypatch):
    with monkeypatch.context() as m:
        interrupted_after(m, 2)
        with pytest.raises(KeyboardInterrupt):
            cache.ensure_quantized(source, method="gptq", **SETTINGS)
    work = next(p for p in cache.awq_root().iterdir() if p.name.startswith(".work-"))
    state = json.loads((work / "state.json").read_text())
    state["key"]["settings"]["seq_len"] = 24  # as if written by a build of other settings
    (work / "state.json").write_text(json.dumps(state))
    read = layers_read(monkeypatch)
    cache.ensure_quantized(source, method="gptq", **SETTINGS)
    assert read == list(range(LAYERS))
