"""`parley bench serve --json` prints one object: per client count and speculation mode, the same requests sent
one by one and all at once against a real `parley serve` subprocess (tokens, tok/s, time to first token and gaps
at p50/p99, peak RSS, the most replies that shared a pass) in the round of median tok/s, with every round's
tok/s, and a long paste beside three short chats."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_bench_serve_prints_one_json_object():
    out = subprocess.run(
        [sys.executable, "-m", "parley.app.cli", "bench", "serve", "--quant", "none", "--clients", "1,2",
         "--tokens", "4", "--speculation", "off,auto", "--repeats", "2", "--paste-tokens", "300", "--timeout", "300",
         "--json"],
        capture_output=True, text=True, timeout=900,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["parallel"] == 4 and report["tokens"] == 4
    assert [(r["clients"], r["speculation"]) for r in report["runs"]] == [(1, "off"), (2, "off"), (1, "auto"),
                                                                         (2, "auto")]
    for run in report["runs"]:
        for how in ("one_by_one", "together"):
            f = run[how]
            assert f["replies"] == run["clients"] and 0 < f["tokens"] <= 4 * run["clients"]
            assert f["tok_s"] > 0 and f["ttft_p50_s"] <= f["ttft_p99_s"] and 1 <= f["batch_max"] <= run["clients"]
            assert f["peak_rss_mb"] is None or f["peak_rss_mb"] > 0
            assert len(f["tok_s_rounds"]) == 2 and f["tok_s"] == max(f["tok_s_rounds"])  # the median of two: upper
        assert run["one_by_one"]["batch_max"] == 1
    paste = report["paste"]
    assert paste["paste_prompt_tokens"] > 250 and len(paste["chat_ttft_s"]) == 3
    assert paste["chat_ttft_max_over_paste"] > 0
