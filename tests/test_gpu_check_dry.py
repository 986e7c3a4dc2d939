"""scripts/gpu_check.sh works before a GPU ever sees it: its --dry mode runs `parley bench gpu` on CPU
(Triton interpreted, toy shapes), from a bare checkout (the package imported through a link, as on the
device), and prints one JSON object with every section and no section failing."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SECTIONS = ["environment", "int4_correctness", "split_k_stress", "int4_speed", "attention", "sdpa_backends", "decode",
            "batch_invariance", "shared_passes", "load_8b", "quantize_8b", "decode_8b"]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env["OUT"] = str(tmp_path_factory.mktemp("gpu_check"))
    env["PYTHON"] = str(Path(os.sys.executable))
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--dry"], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-2000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, "stdout must be exactly one JSON object"
    return json.loads(lines[0])


def test_every_section_ran_without_error(report: dict) -> None:
    for name in SECTIONS:
        assert name in report, name
        assert "error" not in report[name] and "skipped" not in report[name], (name, report[name])
    assert report["ok"] is True


def test_kernel_sections_check_what_they_claim(report: dict) -> None:
    correctness = report["int4_correctness"]
    assert {c["M"] for c in correctness["cases"]} >= {1, 2, 5, 9, 16}
    assert {c["dtype"] for c in correctness["cases"]} == {"bf16", "fp16"}
    assert correctness["rows_bitwise_equal_for_every_m"] is True
    assert correctness["worst_error_over_tolerance"] <= 1.0
    assert report["split_k_stress"]["tickets_left"] == 0
    assert len(report["split_k_stress"]["differing_launches"]) >= 4
    assert not any(report["split_k_stress"]["differing_launches"].values())
    for kind in ("fp", "bf16", "int8", "k8v4"):
        assert report["attention"][kind]["rows_bitwise_independent_of_T"] is True


def test_decode_reports_its_figures(report: dict) -> None:
    decode = report["decode"]
    assert decode["bytes_per_token"] > 0
    assert decode["eager"]["tok_s"] > 0
    assert set(report["batch_invariance"]) >= {"bitwise_equal", "max_abs_logit_diff", "argmax_equal"}
    shared = report["shared_passes"]
    assert shared["bitwise_equal"] is True  # (on CPU: torch's int4 op; the Triton kernel's rows: int4_correctness)
    assert shared["four_passes"]["eager_us"] > 0 and shared["one_shared_pass"]["graph_us"] > 0


def test_the_8b_sections_report_their_figures(report: dict) -> None:
    load = report["load_8b"]
    assert load["checkpoint_gb"] > 0 and load["load_s"] > 0 and load["held_gb"] > 0
    quantize = report["quantize_8b"]
    assert quantize["first_run_s_per_layer"] > 0 and quantize["rtn_s_per_layer"] > 0
    assert quantize["first_run_layers_s_estimate"] >= quantize["first_run_s_per_layer"]
    decode = report["decode_8b"]
    assert decode["eager"]["tok_s"] > 0 and decode["bytes_per_token"] > 0
    assert "peak_gpu_gib_decoding" in decode
