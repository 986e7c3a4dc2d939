#!/usr/bin/env bash
# GPU checks for the INT4 kernels, in well under 5 minutes on one H100/H200-class GPU:
#   1. the kernel tests on CUDA (the Triton cases run natively as well as interpreted; dispatch; compile
#      with CUDA graphs),
#   2. `parley bench kernels` on CUDA: Triton INT4 against fp16 torch.matmul, GB/s against peak HBM,
#   3. `parley bench decode` on a random-weight 7B-shaped model, if that bench offers one (its own issue).
# Figures land in $OUT (default: a temporary folder) as JSON plus the printed tables.
#
# Needs, offline: the CUDA build of torch (>= 2.4; 2.13 tested on CPU), triton (>= 3.0), pytest and
# numpy in .venv (or $PYTHON), and Parley installed editable (`scripts/setup.sh test` does all of it).
# No network and no model files: every weight here is random.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
start=$SECONDS
failed=()  # a failing step is reported at the end; the later steps still run

"$PY" - <<'EOF'
import torch, triton
assert torch.cuda.is_available(), "no CUDA device: this script is for a GPU machine"
print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
EOF

echo "== kernel tests on CUDA"
PARLEY_TRITON_AUTOTUNE=0 timeout 200 "$PY" -m pytest -q -p no:cacheprovider \
  tests/test_triton_int4_matches_reference.py tests/test_kernel_dispatch.py \
  tests/test_cpu_int4_matches_reference.py tests/test_int4_under_torch_compile.py \
  > "$OUT/kernel_tests.txt" 2>&1 || failed+=("kernel tests")
tail -n 25 "$OUT/kernel_tests.txt"

echo "== parley bench kernels (CUDA; first use of each shape autotunes)"
if timeout 200 "$PY" -m parley.app.cli bench kernels --device cuda --json > "$OUT/bench_kernels.json"; then
  "$PY" -c "import json, sys; from parley.app.bench_kernels import print_report; \
print_report(json.load(open(sys.argv[1])))" "$OUT/bench_kernels.json" | tee "$OUT/bench_kernels.txt"
else
  failed+=("bench kernels")
fi

echo "== parley bench decode (random 7B-shaped weights)"
if "$PY" -m parley.app.cli bench decode --help 2>/dev/null | grep -q -- "--random"; then
  timeout 240 "$PY" -m parley.app.cli bench decode --device cuda --random 7b --quant none,awq --json \
    > "$OUT/bench_decode.json" && cat "$OUT/bench_decode.json" || failed+=("bench decode")
else
  echo "skipped: parley bench decode has no random-weight option yet"
fi

echo "== done in $((SECONDS - start)) s; figures in $OUT"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
