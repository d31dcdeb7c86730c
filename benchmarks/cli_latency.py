"""How fast the CLI answers: `rlforge --help`, `rlforge algos`, `rlforge plugins list` and a config error, each
in a fresh process, median of --repeat runs. Target (issue #13): under 2 s each on a 2-core CPU.

    python benchmarks/cli_latency.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = {
    "rlforge --help": ["--help"],
    "rlforge algos": ["algos"],
    "rlforge plugins list": ["plugins", "list"],
    "config error (actor.lr=abc)": ["fit", "actor.lr=abc"],
    "batch-size error": ["fit", "actor.ppo_mini_batch_size=7"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    exe = shutil.which("rlforge", path=str(Path(sys.executable).parent)) or "rlforge"
    print(f"{'command':<30} {'median s':>9} {'max s':>7}")
    for label, argv in COMMANDS.items():
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            subprocess.run([exe, *argv], capture_output=True, timeout=120)
            times.append(time.perf_counter() - t0)
        print(f"{label:<30} {statistics.median(times):>9.2f} {max(times):>7.2f}")


if __name__ == "__main__":
    main()
