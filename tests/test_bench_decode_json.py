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


def test_llama_cpp_figures_sit_beside_parley_as_ratios(tmp_path):
    """--llama-cpp runs the peer script once and divides Parley's figure of the same kind by each of its figures."""
    from parley.bench.decode import llama_cpp_figures, peer_ratios

    script = tmp_path / "peer.sh"
    script.write_text('#!/bin/sh\necho "building..."\n'
                      'echo \'{"engine": "llama.cpp", "type": "q4_0", "what": "prefill", "tokens": 512, "depth": 0, '
                      '"threads": 2, "tok_s": 400.0}\'\n'
                      'echo \'{"engine": "llama.cpp", "type": "q4_0", "what": "decode_at_depth", "tokens": 128, '
                      '"depth": 1900, "threads": 2, "tok_s": 50.0}\'\n')
    script.chmod(0o755)
    peers = llama_cpp_figures(str(script), 2)
    assert [p["what"] for p in peers] == ["prefill", "decode_at_depth"]
    ours = {"prefill_tok_s": 1000.0, "decode": [{"depth": 0, "tok_s": 300.0}, {"depth": 2000, "tok_s": 120.0}]}
    ratios = peer_ratios(ours, peers)
    assert [r["parley_vs_peer"] for r in ratios] == [2.5, 2.4]
    assert "error" in llama_cpp_figures(str(tmp_path / "missing.sh"), 2)
