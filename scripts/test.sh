#!/usr/bin/env bash
# Command 2 of the README: install the test dependencies (idempotent) and run the whole test suite.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh" dev
cd "$root"
exec .venv/bin/pytest -q -ra "$@"
