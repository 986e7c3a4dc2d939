"""`parley bench quality --json` scores fp32, RTN and AWQ models loaded by the engine, on a tiny model
(the plumbing, not the figures), and leaves the process's kernel choice alone."""

import argparse
import json
import os

from awq_tiny import outlier_model, write_hf_dir

from parley.bench import quality as bench_quality


def run_bench(tmp_path, capsys, monkeypatch, *flags: str) -> dict:
    """`bench quality --json` on a tiny model and a short held-out text; the printed object."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = write_hf_dir(outlier_model(), tmp_path / "tiny")
    text = tmp_path / "heldout.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    p = argparse.ArgumentParser()
    bench_quality.add_arguments(p)
    args = p.parse_args(["--model", str(model), "--text", str(text), "--max-chunks", "2", *flags, "--json"])
    assert bench_quality.run(args) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_every_model(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PARLEY_KERNELS", raising=False)
    out = run_bench(tmp_path, capsys, monkeypatch, "--chunk", "64", "--group-size", "64", "--calib", "builtin",
                    "--samples", "4", "--seq-len", "32", "--agreement-tokens", "4")
    assert set(out["results"]) == {"fp32", "rtn_int4", "awq_int4"}
    awq = out["results"]["awq_int4"]
    # g64: 4 bits + an fp16 scale and a 4-bit zero per 64 weights
    assert awq["bits_per_weight"] == out["results"]["rtn_int4"]["bits_per_weight"] == 4 + 20 / 64
    assert awq["method"] == "rotate+awq-no-down-scale+clip-qk+gptq+refit+hadamard-down256+distill"
    agreement = awq["greedy_agreement"]
    assert len(agreement["prompts"]) == 4 and 0 <= agreement["worst"] <= agreement["median"] <= 4
    for r in out["results"].values():
        assert r["ppl"] > 1
    assert out["results"]["awq_int4"]["head"] == "fp"  # --kernels reference: the quantization alone
    assert out["results"]["fp32"]["vs_fp32"] == 0 and out["chunks"] == 2 and out["peak_rss_mb"] > 0
    assert "PARLEY_KERNELS" not in os.environ


def test_the_standard_down_proj_is_named_when_the_rotation_is_off(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PARLEY_DOWN_HADAMARD", "0")
    out = run_bench(tmp_path, capsys, monkeypatch, "--chunk", "64", "--group-size", "64", "--calib", "builtin",
                    "--samples", "4", "--seq-len", "32", "--agreement-tokens", "0")
    method = out["results"]["awq_int4"]["method"]
    assert method == "rotate+awq-no-down-scale+clip-qk+gptq+refit (standard down_proj: rotation off)"


def test_kv_cache_mode_scores_each_cache_type_against_fp(tmp_path, capsys, monkeypatch):
    out = run_bench(tmp_path, capsys, monkeypatch, "--chunk", "128", "--kv-cache", "int8,k8v4", "--summary-tokens", "8")
    assert out["mode"] == "kv_cache" and list(out["results"]) == ["fp", "int8", "k8v4"]
    assert out["results"]["fp"]["vs_fp"] == 0
    # quantized caches change the scores a little, never a lot (a tiny random model: loose bounds)
    for kind in ("int8", "k8v4"):
        assert out["results"][kind]["ppl"] != out["results"]["fp"]["ppl"]
        assert abs(out["results"][kind]["vs_fp"]) < 0.5
    for r in out["results"].values():
        assert 0 <= r["summary_agreement"] <= 1 and 0 <= r["summary_same_prefix"] <= 8
    assert out["results"]["fp"]["summary_agreement"] == 1 and out["results"]["fp"]["summary_same_prefix"] == 8
