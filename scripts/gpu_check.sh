#!/usr/bin/env bash
# Every GPU figure in one short run (<= 8 minutes), for a bare offline GPU machine: only this repository
# and a Python with torch (CUDA build) and Triton. No .venv, no model files, no network, no gguf.
# Prints one JSON object on stdout (progress on stderr) and keeps a copy in $OUT (default: a temp dir).
#   scripts/gpu_check.sh            the full check: `parley bench gpu` (bench/gpu.py lists the sections)
#   scripts/gpu_check.sh --dry      the same Python on CPU at toy shapes, Triton interpreted
#   scripts/gpu_check.sh --only load_8b,quantize_8b,decode_8b
#                                   the Llama-3.1-8B shape alone (~4 minutes: a full run reaches it only
#                                   with time left; its temp checkpoint needs 16 GB of disk, GPU_CHECK_TMP)
# PYTHON picks the interpreter (default: .venv/bin/python if present, else python3).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$([ -x "$repo/.venv/bin/python" ] && echo "$repo/.venv/bin/python" || echo python3)}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"

# The repository root is the `parley` package, whatever its folder is called here: import it through a
# link named `parley`.
pkg=$(mktemp -d)
trap 'rm -rf "$pkg"' EXIT
ln -s "$repo" "$pkg/parley"
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}"
export PARLEY_TRITON_AUTOTUNE=0   # the prefill GEMM's first config: tuning every shape costs minutes
export TRITON_DEFAULT_FP_FUSION=1  # Triton 3.9's default, stated (silences its warning)
if [ "${1:-}" = "--dry" ]; then
  export TRITON_INTERPRET=1
fi

# 420 s of sections plus start-up and the last section's overrun stay under the 480 s hard limit; if
# that limit ends the run, the sections finished so far are printed (marked "incomplete").
export GPU_CHECK_PARTIAL="$OUT/gpu_check.partial.json"
status=0
timeout -k 10 480 "$PY" -m parley.app.cli bench gpu "$@" --budget-s 420 > "$OUT/gpu_check.json" \
  2> >(tee "$OUT/gpu_check.log" >&2) || status=$?
if [ -s "$OUT/gpu_check.json" ]; then
  cat "$OUT/gpu_check.json"
elif [ -s "$GPU_CHECK_PARTIAL" ]; then
  cat "$GPU_CHECK_PARTIAL"; echo
else
  echo '{"ok": false, "incomplete": "no section finished; see the log"}'
fi
echo "gpu_check: exit $status; JSON and log in $OUT" >&2
exit $status
