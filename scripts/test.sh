#!/usr/bin/env bash
# Command 2 of the README: install the test dependencies (idempotent) and run the whole test suite.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh" dev
cd "$root"
# The Ray controller's tests run a real local Ray cluster (the optional extra rlforge[ray]).
.venv/bin/python -c 'import ray' 2>/dev/null \
  || .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt "ray>=2.40"
exec .venv/bin/pytest -q -ra "$@"
