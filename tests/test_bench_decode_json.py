"""`parley bench decode --json` prints one object with a figure per engine variant and peak memory."""

import json
import subprocess
import sys


def test_random_weights_bench_prints_one_json_object():
    out = subprocess.run(
        [sys.executable, "-m", "parley.app.cli", "bench", "decode", "--random", "small", "--quant", "none,awq",
         "--new-tokens", "4", "--prefill-tokens", "16", "--repeats", "1", "--threads", "1", "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert set(report["engines"]) == {"none/native/kv=auto", "awq/native/kv=auto"}
    for r in report["engines"].values():
        assert r["decode"][0]["tok_s"] > 0 and r["prefill_tok_s"] > 0
        assert r["decode"][0]["mb_per_token"] > 0 and r["decode"][0]["pct_of_bandwidth"] > 0
    assert report["engines"]["awq/native/kv=auto"]["quantization"] == "rtn-int4"
    assert report["read_bandwidth_gbs"] > 0 and report["peak_rss_mb"] > 0
    if sys.platform == "linux":  # the peak after loading: what holding and using a context costs
        for r in report["engines"].values():
            assert 0 < r["peak_rss_in_use_mb"] <= report["peak_rss_mb"] + 1 and r["rss_mb"] > 0  # (two counters)
