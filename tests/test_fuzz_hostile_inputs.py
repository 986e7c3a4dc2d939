"""The seeded fuzzer (`bench/fuzz.py`) at a small budget: configs, GGUF headers, chat templates and HTTP
requests mutated from valid ones each end cleanly (a value, or a one-line error of the expected kind; no 500, no
raw control character in the server's log). `parley bench faults --fuzz N` runs it at a large budget.

A failure names the seed of its case: `fuzz.case(kind, seed, folder)()` rebuilds and reruns it. The seed of
this run is printed, and set with PARLEY_FUZZ_SEED to try others."""

from __future__ import annotations

import os

import pytest

from parley.bench import fuzz

SEED = int(os.environ.get("PARLEY_FUZZ_SEED", "36"))
BUDGET = {"config": 200, "gguf": 40, "template": 120, "http": 60}


@pytest.mark.parametrize("kind", fuzz.KINDS)
def test_fuzzed_inputs_end_cleanly(kind):
    print(f"fuzz seed {SEED}")
    failures = fuzz.fuzz(BUDGET[kind], SEED, kinds=(kind,))[kind]["failures"]
    assert not failures, "\n".join(f"{kind} seed {f['seed']}: {f['why']}" for f in failures)


def test_a_case_is_rebuilt_from_its_seed(tmp_path):
    """The seed is all a report needs: the same seed makes the same case."""
    import random

    assert fuzz.http_request(random.Random(5)) == fuzz.http_request(random.Random(5))
    for n in ("a", "b"):
        (tmp_path / n).mkdir()
    fuzz.case("gguf", 7, tmp_path / "a")
    fuzz.case("gguf", 7, tmp_path / "b")
    assert (tmp_path / "a" / "fuzz.gguf").read_bytes() == (tmp_path / "b" / "fuzz.gguf").read_bytes()
