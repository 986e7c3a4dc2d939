"""CPUs without AVX-512 VNNI (most laptops) get cpu_step.cpp's portable loops: build that variant here
(PARLEY_NATIVE_FLAGS=-mno-avx512vnni, its own cache folder) and run the native step's reference,
batch-invariance and attention tests against it, in a child process so this one keeps its library."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from parley.kernels import native

pytestmark = pytest.mark.skipif(native.load() is None or not native.load().parley_has_vnni(),
                                reason="this machine builds the portable loops already: the other tests cover them")

TESTS = Path(__file__).parent


def test_portable_loops_pass_the_native_tests(tmp_path: Path) -> None:
    env = {**os.environ, "PARLEY_NATIVE_FLAGS": "-mno-avx512vnni", "PARLEY_NATIVE_DIR": str(tmp_path)}
    check = "from parley.kernels import native; assert native.load().parley_has_vnni() == 0"
    r = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(TESTS / "test_native_linear_matches_reference.py"),
                        str(TESTS / "test_native_linear_reads_gguf_groups.py"),
                        str(TESTS / "test_native_step_batch_invariance.py"),
                        str(TESTS / "test_native_attention_matches_banded_reference.py"),
                        str(TESTS / "test_down_hadamard_rotation_is_exact.py")],
                       env=env, capture_output=True, text=True, timeout=1200, cwd=TESTS.parent)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
