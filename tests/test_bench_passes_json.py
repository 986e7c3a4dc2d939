"""`parley bench passes --json` prints one object: each pass length's time and ratio to a 1-token pass per depth,
the INT4 products' GMAC/s per core beside the VNNI peak, and a prefill's one-thread CPU time."""

import json
import subprocess
import sys

import pytest

from parley.models import native_forward


@pytest.mark.skipif(native_forward.library() is None, reason="the native step is unavailable here")
def test_random_weights_bench_prints_one_json_object():
    out = subprocess.run(
        [sys.executable, "-m", "parley.app.cli", "bench", "passes", "--random", "small", "--passes", "1,2,4",
         "--depths", "0,300", "--rows", "8", "--repeats", "1", "--threads", "1", "--prefill-tokens", "40", "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [d["depth"] for d in report["depths"]] == [0, 300]
    for d in report["depths"]:
        assert [p["tokens"] for p in d["passes"]] == [1, 2, 4]
        assert d["passes"][0]["vs_one_token"] == 1.0 and all(p["ms"] > 0 for p in d["passes"])
    assert report["depths"][1]["context"] == 300
    products = report["products"]
    assert [r["rows"] for r in products["by_rows"]] == [8] and products["by_rows"][0]["gmacs_per_core"] > 0
    assert products["vnni_peak_gmacs_per_core"] >= 0  # 0 where the CPU has no VNNI
    prefill = report["prefill_one_thread_cpu"]
    assert prefill["tokens"] == 40 and prefill["ms"] > 0 and prefill["tokens_per_cpu_second"] > 0
