#!/usr/bin/env bash
# Rebuilds the shipped base model rlforge/assets/tiny-arith with rlforge's own SFT command:
# a fresh char-level Llama (hidden 128, 4 layers, 2 heads of dim 64) trained on the built-in arith task.
# Each step draws its 64 examples at random (sft.sampling=random), as the model was first built; no
# checkpoints and no logs, so that the folder holds only the Hugging Face files.
# Deterministic on CPU for a given torch version; takes a few minutes on 2 cores.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
cd "$root"
exec .venv/bin/rlforge sft sft.init=tiny-arith sft.output_dir=rlforge/assets/tiny-arith sft.sampling=random sft.save_every=0 \
  'sft.loggers=[]' "$@"
