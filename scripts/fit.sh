#!/usr/bin/env bash
# Command 1 of the README: install everything (idempotent) and run the main job on the built-in default.
# Extra arguments go to `rlforge fit`, e.g. `bash scripts/fit.sh trainer.total_steps=50`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
cd "$root"
exec .venv/bin/rlforge fit --algo grpo "$@"
