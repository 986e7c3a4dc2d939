"""Every flavour of the native library is tested wherever the machine can run it, not only the one it builds by default.

A build is AVX-512 VNNI with AMX tiles (Intel Sapphire Rapids and later), AVX-512 VNNI, AVX2 + FMA (most
laptops) or the portable loops, whichever the compiler's target allows (`parley_simd()`: 3, 2, 1, 0). Here the
flavours below this machine's own are built with PARLEY_NATIVE_FLAGS (VNNI without AMX with -mno-amx-tile
-mno-amx-int8, AVX2 with -mno-avx512f, the portable loops with -mno-avx2 -mno-avx512f), each in its own library
folder, and the native step's reference, batch-invariance, tree, attention and several-sequence pass tests run
against each in a child process, so this process keeps its library. An AMX machine tests all three, a VNNI
machine two, an AVX2 machine the portable loops.

The AMX and AVX2 flavours compute the VNNI path's values (the same exact integer sums, and its float operations in
the same order): a child's logits of small models, every arch and cache type, must equal this process's bit for
bit on a machine of a higher flavour."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from parley.models import native_forward

TESTS = Path(__file__).parent
LEVEL = native_forward.library().parley_simd() if native_forward.library() is not None else 0
# what each flavour's build adds to -march=native
FLAVOURS = {2: "-mno-amx-tile -mno-amx-int8", 1: "-mno-avx512f", 0: "-mno-avx2 -mno-avx512f"}
NAMES = {2: "vnni", 1: "avx2", 0: "portable"}

pytestmark = pytest.mark.skipif(LEVEL == 0, reason="this machine builds the portable loops already: the other "
                                                   "tests cover them")

CHILD_TESTS = {  # the portable loops are slow: fewer files, and the attention test runs fewer cases on them
    2: ["test_native_linear_matches_reference.py", "test_native_linear_reads_gguf_groups.py",
        "test_native_step_batch_invariance.py", "test_native_tree_pass_equals_linear_paths.py",
        "test_native_batch_pass_rows_equal_their_sequence_alone.py"],
    1: ["test_native_linear_matches_reference.py", "test_native_linear_reads_gguf_groups.py",
        "test_native_step_batch_invariance.py", "test_native_attention_matches_banded_reference.py",
        "test_native_tree_pass_equals_linear_paths.py", "test_down_hadamard_rotation_is_exact.py",
        "test_native_batch_pass_rows_equal_their_sequence_alone.py"],
    0: ["test_native_linear_matches_reference.py", "test_native_linear_reads_gguf_groups.py",
        "test_native_step_batch_invariance.py", "test_native_attention_matches_banded_reference.py",
        "test_down_hadamard_rotation_is_exact.py", "test_native_batch_pass_rows_equal_their_sequence_alone.py"],
}


def small_model_logits() -> dict[str, torch.Tensor]:
    """Logits of small random models on this process's library: every arch the step runs (Gemma 3: GeGLU, sandwich
    norms, its own rotary tables) with INT4 weights, and fp32 weights (llama), every cache type, passes of 1, 7
    and 22 positions after a 260-position prefill (across the 256-key block edge)."""
    import random

    from native_models import logits_in_chunks, small_model

    from parley.models.native_step import NativeStep
    from parley.models.transformer import KV_CACHE_TYPES

    out = {}
    for arch, int4 in [("llama", True), ("qwen2", True), ("qwen3", True), ("gemma3", True), ("llama", False)]:
        model = small_model(int4, seed=3, arch=arch, norms=True)
        step = NativeStep.for_model(model, head_bits=8 if int4 else 32)
        ids = [random.Random(5).randrange(300) for _ in range(290)]
        for kind in KV_CACHE_TYPES:
            out[f"{arch} int4={int4} {kind}"] = logits_in_chunks(model, ids, [260, 1, 7, 22], kind, step)
    return out


def flavour_env(level: int, folder: Path) -> dict[str, str]:
    return {**os.environ, "PARLEY_NATIVE_FLAGS": FLAVOURS[level], "PARLEY_NATIVE_DIR": str(folder)}


def built(level: int, folder: Path) -> dict[str, str]:
    """The environment of a child that loads flavour `level`, built into `folder` (checked to be that flavour)."""
    env = flavour_env(level, folder)
    check = f"from parley.models import native_forward; assert native_forward.library().parley_simd() == {level}"
    r = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return env


@pytest.fixture(scope="module")
def flavour_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """One library folder per flavour, shared by its two tests (a build takes a while)."""
    return {level: tmp_path_factory.mktemp(f"{NAMES[level]}-flavour") for level in FLAVOURS}


@pytest.mark.parametrize("level", [lv for lv in (2, 1, 0) if lv < LEVEL], ids=lambda lv: NAMES[lv])
def test_flavour_passes_the_native_tests(level: int, flavour_dirs: dict[int, Path]) -> None:
    env = built(level, flavour_dirs[level])
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        *[str(TESTS / name) for name in CHILD_TESTS[level]]],
                       env=env, capture_output=True, text=True, timeout=1200, cwd=TESTS.parent)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


@pytest.mark.parametrize("level", [lv for lv in (2, 1) if LEVEL >= 2 and lv < LEVEL], ids=lambda lv: NAMES[lv])
def test_flavour_computes_this_builds_bits(level: int, tmp_path: Path, flavour_dirs: dict[int, Path]) -> None:
    """On an AMX machine VNNI and AVX2 against the AMX build, on a VNNI machine AVX2 against the VNNI build."""
    env = built(level, flavour_dirs[level])
    dump = ("import sys, torch; sys.path.insert(0, sys.argv[2]); from test_native_portable_loops import "
            "small_model_logits; torch.save(small_model_logits(), sys.argv[1])")
    r = subprocess.run([sys.executable, "-c", dump, str(tmp_path / "child.pt"), str(TESTS)], env=env,
                       capture_output=True, text=True, timeout=600, cwd=TESTS.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    child, own = torch.load(tmp_path / "child.pt"), small_model_logits()
    differ = [name for name in own if not torch.equal(child[name], own[name])]
    assert not differ, f"the {NAMES[level]} flavour's logits differ from this build's ({LEVEL}): {differ}"
