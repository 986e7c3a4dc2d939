"""`parley bench decode --random SHAPE --llama-cpp ...` runs llama.cpp on the same weights Parley ran: one bf16
checkpoint (seed 0) gives Parley's INT4 folder and a BF16 GGUF that llama-quantize (beside llama-bench) turns
into Q4_0 and Q4_K_M, and llama-bench runs on each of those. Fakes stand in for llama.cpp's binaries (the fake
llama-quantize copies its input), so the GGUF it "quantized" can be checked to hold the checkpoint's weights."""

import json
import subprocess
import sys

import torch

FAKE_BENCH = """#!{python}
import json, sys
args = sys.argv[1:]
open({log!r}, "a").write(json.dumps(["bench"] + args) + "\\n")
opt = dict(zip(args[::2], args[1::2]))
kind = opt["-m"].rsplit("/", 1)[1].removesuffix(".gguf")
rows = [(int(opt["-p"]), 0, 0, 80.0)] if opt["-p"] != "0" else []
rows.append((0, int(opt["-n"]), int(opt.get("-d", 0)), 40.0))
for p, n, d, ts in rows:
    print(json.dumps({{"model_type": "fake " + kind, "n_prompt": p, "n_gen": n, "n_depth": d,
                      "n_threads": int(opt["-t"]), "avg_ts": ts}}))
"""
FAKE_QUANTIZE = """#!{python}
import json, shutil, sys
open({log!r}, "a").write(json.dumps(["quantize"] + sys.argv[1:]) + "\\n")
shutil.copyfile(sys.argv[1], sys.argv[2])
"""


def _fake(path, text, **kw):
    path.write_text(text.format(python=sys.executable, **kw))
    path.chmod(0o755)


def test_llama_cpp_runs_q4_0_and_q4_k_m_quantized_from_the_same_checkpoint(tmp_path):
    log = tmp_path / "calls.jsonl"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake(bin_dir / "llama-bench", FAKE_BENCH, log=str(log))
    _fake(bin_dir / "llama-quantize", FAKE_QUANTIZE, log=str(log))
    cmd = [sys.executable, "-m", "parley.app.cli", "bench", "decode", "--random", "small", "--quant", "awq",
           "--llama-cpp", str(bin_dir / "llama-bench"), "--new-tokens", "3", "--prefill-tokens", "8", "--depths",
           "0,20", "--repeats", "1", "--threads", "1", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    quantized = [c for c in calls if c[0] == "quantize"]
    assert [c[3] for c in quantized] == ["Q4_0", "Q4_K_M"]
    assert {c[1].rsplit("/", 1)[1] for c in quantized} == {"bf16.gguf"}
    benched = [c[c.index("-m") + 1].rsplit("/", 1)[1] for c in calls if c[0] == "bench"]
    assert benched == ["Q4_0.gguf", "Q4_0.gguf", "Q4_K_M.gguf", "Q4_K_M.gguf"]
    ratios = report["engines"]["awq/native/kv=auto"]["vs_llama_cpp"]
    assert [(r["type"], r["what"]) for r in ratios] == [
        (f"fake {k}", w) for k in ("Q4_0", "Q4_K_M") for w in ("prefill", "decode", "decode_at_depth")]
    assert report["engines"]["awq/native/kv=auto"]["quantization"] == "rtn-int4"

    # the file llama-quantize read holds the checkpoint's weights (names mapped, q/k rows permuted back)
    from parley.bench.random_weights import checkpoint, root
    from parley.models.loading import load_model
    from parley.models.resolve import ModelFiles

    src = checkpoint("small")
    ref = load_model(ModelFiles(ref="ref", kind="dir", path=src)).state_dict()
    got = load_model(ModelFiles(ref="q", kind="gguf", path=root("small") / "gguf" / "Q4_0.gguf")).state_dict()
    assert set(ref) == set(got)
    assert all(torch.equal(ref[k], got[k]) for k in ref), [k for k in ref if not torch.equal(ref[k], got[k])]

    # asked again, the files are reused: no second quantization
    from parley.bench.random_weights import llama_cpp_files

    assert set(llama_cpp_files("small", str(bin_dir / "llama-quantize"))) == {"Q4_0", "Q4_K_M"}
    assert len([c for c in map(json.loads, log.read_text().splitlines()) if c[0] == "quantize"]) == 2
