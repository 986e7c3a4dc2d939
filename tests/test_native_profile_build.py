"""The profile build (PARLEY_NATIVE_FLAGS=-DPARLEY_PROFILE) computes what the shipped build does and reports each
thread's work and barrier wait per phase (`parley bench passes --profile`).

Its passes drop each `omp for`'s implicit barrier and meet in the timer instead: a phase left without its timer
would let a thread read rows the other is still writing. So the batch-invariance tests run against that build
too (bitwise, 2 threads), in a child process with its own library folder, and the bench's profile must name
the phases of a pass with a figure per thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parley.models import native_forward

pytestmark = pytest.mark.skipif(native_forward.library() is None, reason="the native step is unavailable here")

TESTS = Path(__file__).parent


def test_profile_build_is_batch_invariant_and_reports_every_phase(tmp_path: Path) -> None:
    # the flavour this run builds (PARLEY_NATIVE_FLAGS, e.g. -mno-avx512f for the AVX2 one), with the timer
    flags = f"{os.environ.get('PARLEY_NATIVE_FLAGS', '')} -DPARLEY_PROFILE".strip()
    env = {**os.environ, "PARLEY_NATIVE_FLAGS": flags, "PARLEY_NATIVE_DIR": str(tmp_path), "PARLEY_THREADS": "2"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(TESTS / "test_native_step_batch_invariance.py")],
                       env=env, capture_output=True, text=True, timeout=1200, cwd=TESTS.parent)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "parley.app.cli", "bench", "passes", "--random", "small", "--passes",
                        "1,4", "--depths", "0", "--rows", "8", "--repeats", "2", "--threads", "2", "--breakdown", "4",
                        "--prefill-tokens", "0", "--profile", "--json"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    profiles = json.loads(r.stdout)["depths"][0]["profile"]
    assert [p["tokens"] for p in profiles] == [1, 4], profiles
    for p in profiles:
        assert p["threads"] == 2
        assert {"qkv", "attend", "gate_up", "down", "head"} <= set(p["phases"]), p["phases"]
        for per_thread in p["phases"].values():
            assert len(per_thread) == 2 and all(w >= 0 and x >= 0 for w, x in per_thread)
        assert sum(p["work_ms"]) > 0


def test_shipped_build_says_it_has_no_timer() -> None:
    from parley.bench.passes import phase_profile

    class Engine:  # only what phase_profile reads before it finds no timer
        native = type("Step", (), {"lib": native_forward.library()})()

    assert "PARLEY_PROFILE" in phase_profile(Engine(), [1, 2], 4, 1)["error"]
