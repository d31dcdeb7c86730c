#!/usr/bin/env bash
# Command 2 of the README: install the test dependencies (idempotent) and run the whole test suite.
#   bash scripts/test.sh                    # the whole suite (what CI runs through .ci/run)
#   bash scripts/test.sh --learning-matrix  # the long learning runs instead: every algorithm learns (docs/testing.md)
#   bash scripts/test.sh tests/test_config.py -x   # extra arguments go to pytest
# It prints the machine's speed first and the total time (scaled to the slowest CI machine) last, so every log says
# what it ran on. Only GPU tests may skip here (RLFORGE_STRICT_SKIPS): a missing extra fails instead of passing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh" test
cd "$root"
py=.venv/bin/python
selection=(-m "not learning_matrix")
if [ "${1:-}" = "--learning-matrix" ]; then
  shift
  selection=(-m learning_matrix)
fi
# pytest-xdist: one worker per core (at most 4; RLFORGE_TEST_WORKERS overrides, 0 = none), each test file whole on one
# worker (tests/conftest.py's scheduler), so its module-scoped engine or cluster starts once. Most of the
# suite's time is process starts, imports and small ops that keep one core busy; each worker computes on one thread.
cores=$(nproc)
workers=${RLFORGE_TEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}
parallel=()
if [ "$workers" -gt 1 ]; then parallel=(-n "$workers"); fi
speed_line=$($py scripts/machine_speed.py)
echo "$speed_line"
speed=$(sed -E 's/.*2 threads ([0-9]+) GFLOP.*/\1/' <<<"$speed_line")  # the figure printed is the one the time is scaled by
start=$(date +%s)
rc=0
RLFORGE_STRICT_SKIPS=1 .venv/bin/pytest -q -ra --durations=25 "${parallel[@]}" "${selection[@]}" "$@" || rc=$?
seconds=$(( $(date +%s) - start ))
$py - "$seconds" "$speed" <<'EOF'
import sys
seconds, speed = int(sys.argv[1]), float(sys.argv[2])
scaled = seconds * speed / 120
print(f"test time {seconds // 60}m{seconds % 60:02d}s on a machine of {speed:.0f} GFLOP/s "
      f"= about {scaled / 60:.1f} min on the slowest CI machine seen (120 GFLOP/s; budget 45 min)")
EOF
exit $rc
