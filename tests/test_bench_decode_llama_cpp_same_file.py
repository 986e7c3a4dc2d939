"""`parley bench decode --model FILE.gguf --llama-cpp SCRIPT` compares against llama.cpp on that same file:
llama-bench runs with `-m FILE` (not the peer script's re-quantized copies of the embedded model) for the
prefill and decode figures the bench measures, and Parley's ratios sit beside its rows."""

import json
import shutil
import subprocess
import sys

from parley.models.resolve import embedded_model_path

FAKE = """#!{python}
import json, sys
args = sys.argv[1:]
open({log!r}, "a").write(json.dumps(args) + "\\n")
opt = dict(zip(args[::2], args[1::2]))
print("llama-bench chatter")
print(json.dumps({{"model_type": "fake Q4_1", "n_prompt": int(opt["-p"]), "n_gen": int(opt["-n"]) if opt["-p"] == "0"
                  else 0, "n_depth": int(opt.get("-d", 0)), "n_threads": int(opt["-t"]), "avg_ts": 100.0}}))
if opt["-p"] != "0":
    print(json.dumps({{"model_type": "fake Q4_1", "n_prompt": 0, "n_gen": int(opt["-n"]), "n_depth": 0,
                      "n_threads": int(opt["-t"]), "avg_ts": 50.0}}))
"""


def test_llama_bench_runs_on_the_model_file_parley_loaded(tmp_path):
    model = tmp_path / "my model.gguf"
    shutil.copyfile(embedded_model_path(), model)
    log = tmp_path / "calls.jsonl"
    fake = tmp_path / "bin" / "llama-bench"
    fake.parent.mkdir()
    fake.write_text(FAKE.format(python=sys.executable, log=str(log)))
    fake.chmod(0o755)
    script = tmp_path / "llama_cpp.sh"  # the peer script: must not be run for a GGUF --model
    script.write_text("#!/bin/sh\necho '{\"engine\": \"llama.cpp\", \"type\": \"smol\", \"what\": \"decode\"}'\n")
    script.chmod(0o755)
    out = subprocess.run(
        [sys.executable, "-m", "parley.app.cli", "bench", "decode", "--model", str(model), "--quant", "none",
         "--llama-cpp", str(script), "--llama-bench", str(fake), "--new-tokens", "3", "--prefill-tokens", "8",
         "--depths", "0,20", "--repeats", "1", "--threads", "1", "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c[c.index("-m") + 1] for c in calls] == [str(model)] * 2
    assert [c[c.index("-p") + 1] for c in calls] == ["8", "0"] and calls[1][calls[1].index("-d") + 1] == "20"
    assert all(c[c.index("-t") + 1] == "1" and c[c.index("-n") + 1] == "3" for c in calls)
    peers = report["llama_cpp"]
    assert [(p["what"], p["depth"]) for p in peers] == [("prefill", 0), ("decode", 0), ("decode_at_depth", 20)]
    assert {p["type"] for p in peers} == {"fake Q4_1"} and {p["model_file"] for p in peers} == {str(model)}
    ratios = report["engines"]["none/native/kv=auto"]["vs_llama_cpp"]
    assert [r["what"] for r in ratios] == ["prefill", "decode", "decode_at_depth"]
    assert all(r["parley_vs_peer"] > 0 for r in ratios)


def test_a_missing_llama_bench_is_one_clear_error(tmp_path):
    from parley.bench.decode import llama_bench_figures, llama_bench_path

    assert llama_bench_path(str(tmp_path / "llama-bench"), None) == str(tmp_path / "llama-bench")
    assert llama_bench_path("x/llama_cpp.sh", "y/llama-bench") == "y/llama-bench"
    got = llama_bench_figures(str(tmp_path / "nothing"), "m.gguf", 1, 8, 3, [0], 1)
    assert "no llama-bench there" in got["error"] and "--llama-bench" in got["error"]
