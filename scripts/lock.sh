#!/usr/bin/env bash
# Refresh constraints.txt: the exact versions of a fresh test environment (docs/install.md#constraintstxt).
# It builds a throw-away virtual environment the way scripts/setup.sh does, without the old constraints, installs
# the test extras and writes `pip freeze` (torch and rlforge left out). Run `bash scripts/test.sh` after it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv=$(mktemp -d)/venv
"${PYTHON:-python3}" -m venv "$venv"
pip_q() { "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@"; }
source "$root/scripts/torch.sh"
install_torch "$venv/bin/python"
pip_q ".[test]"
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
{
  echo "# The versions CI tested (scripts/lock.sh, $(date -u +%Y-%m-%d), Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())')); torch is chosen by scripts/setup.sh."
  "$venv/bin/python" -m pip freeze --exclude-editable | grep -v -i -E '^(torch|rlforge)( @|==)'
} > constraints.txt
rm -rf "$(dirname "$venv")"
echo "constraints.txt: $(grep -vc '^#' constraints.txt) pinned packages"
