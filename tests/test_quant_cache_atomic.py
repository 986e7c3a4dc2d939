"""The quantized-model cache is atomic: a quantizer killed (SIGKILL) at a random moment never leaves a
folder that a later run would load, and a folder that does not verify is rebuilt, with the reason logged."""

import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from awq_tiny import outlier_model, write_hf_dir

from parley.models.loading import load_model
from parley.models.quantize.cache import awq_root, ensure_quantized, verify
from parley.models.resolve import resolve

SETTINGS = dict(group_size=32, calib="builtin", n_samples=8, seq_len=32)

QUANTIZER = f"""
import sys
from parley.models.quantize.cache import ensure_quantized
from parley.models.resolve import resolve
files = resolve(sys.argv[1])
print("ready", flush=True)
print(ensure_quantized(files, **{SETTINGS!r}).path, flush=True)
"""


@pytest.fixture
def source(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_CACHE_DIR", str(tmp_path / "cache"))  # a cache of its own: it empties it
    return resolve(str(write_hf_dir(outlier_model(), tmp_path / "tiny")))


def start_quantizer(source) -> tuple[subprocess.Popen, float]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", QUANTIZER, str(source.path)], stdout=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    return proc, time.monotonic()


def assert_no_partial_folder(why: str) -> None:
    """Every folder under its final name is complete: manifest present and every file as it records."""
    root = awq_root()
    for folder in root.iterdir() if root.exists() else []:
        if folder.name.startswith("."):
            continue  # temporary build folders: never returned, removed once their builder is dead
        assert (folder / "manifest.json").is_file(), f"{why}: {folder} has no manifest"
        manifest = json.loads((folder / "manifest.json").read_text())
        assert verify(folder, manifest["key"]) is None, f"{why}: {folder}"


def test_sigkill_at_random_moments_never_leaves_a_partial_folder(source):
    # one uninterrupted build times the window the kills are spread over
    proc, t0 = start_quantizer(source)
    built = Path(proc.stdout.readline().strip())
    assert proc.wait() == 0
    duration = time.monotonic() - t0
    seed = int(os.environ.get("PARLEY_TEST_SEED", "20261129"))  # set it to replay a failure
    rng = random.Random(seed)
    for kill in range(3):
        shutil.rmtree(awq_root())  # start from an empty cache
        proc, t0 = start_quantizer(source)
        delay = rng.uniform(0, duration * 1.1)  # a random moment of the build (not a race: any moment is valid)
        time.sleep(max(0.0, delay - (time.monotonic() - t0)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # what a next run would load (a folder under its final name) is complete, whenever the kill came
        assert_no_partial_folder(f"PARLEY_TEST_SEED={seed}, kill {kill} at {delay:.2f} s of {duration:.2f} s")
    # and the next run gets a complete folder (the finished one, or a fresh build) and removes the dead
    # builder's temporary folder
    out = ensure_quantized(source, **SETTINGS)
    assert out.path == built, f"seed {seed}"
    assert verify(out.path, json.loads((out.path / "manifest.json").read_text())["key"]) is None
    load_model(out)
    assert not [p for p in awq_root().iterdir() if p.name.startswith(".tmp-")], f"seed {seed}: stale temp"


def test_folder_that_does_not_verify_is_rebuilt(source, caplog):
    out = ensure_quantized(source, **SETTINGS)
    weights = out.path / "model.safetensors"
    good = weights.read_bytes()

    weights.write_bytes(good[: len(good) // 2])  # truncated
    with caplog.at_level(logging.WARNING, logger="parley.quantize"):
        again = ensure_quantized(source, **SETTINGS)
    assert again.path == out.path and weights.read_bytes() == good
    assert "model.safetensors has" in caplog.text and "rebuilding" in caplog.text

    caplog.clear()
    (out.path / "manifest.json").unlink()  # as a build killed before its last write would leave it
    with caplog.at_level(logging.WARNING, logger="parley.quantize"):
        ensure_quantized(source, **SETTINGS)
    assert "no manifest" in caplog.text
    assert verify(out.path, json.loads((out.path / "manifest.json").read_text())["key"]) is None

    caplog.clear()
    flipped = bytearray(good)
    flipped[-1] ^= 1  # same size, one bit different
    weights.write_bytes(bytes(flipped))
    with caplog.at_level(logging.WARNING, logger="parley.quantize"):
        ensure_quantized(source, **SETTINGS)
    assert "sha256" in caplog.text and weights.read_bytes() == good
