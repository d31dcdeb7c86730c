#!/usr/bin/env bash
# Idempotent environment set-up: a virtual environment in .venv with the CPU torch wheel and rlforge.
# Usage: bash scripts/setup.sh [EXTRAS]    e.g. EXTRAS=dev  -> pip install -e ".[dev]"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
extras=${1:-}
py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
pip_q() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@"; }
# torch first, pinned: anything that asks for a newer torch would pull a multi-GB CUDA build.
.venv/bin/python -c 'import torch' 2>/dev/null || pip_q "torch==2.13.0"
spec="."
[ -n "$extras" ] && spec=".[$extras]"
# The stamp skips the (slow) resolver when nothing changed since the last successful install.
stamp=".venv/.rlforge-installed-${extras:-base}"
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  pip_q -c constraints.txt -e "$spec"
  echo "$want" > "$stamp"
fi
