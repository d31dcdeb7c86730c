"""Random kill -9 / resume cycles against an uninterrupted run: the final weights must match bit for bit.

    python benchmarks/kill_resume.py --cycles 10 [--trials 2] [--steps 8] [--seed 0] [--workdir DIR]

Each trial trains one run of ``--steps`` steps on the tiny model through the real CLI
(``rlforge fit ... trainer.resume=auto``, a checkpoint after every step, all kept). Each cycle starts the
command and sends ``SIGKILL`` at a random moment: during start-up (one cycle in five), else at a random time
after the process took the run (a rollout, an update, a checkpoint write: wherever it lands). Once the run
exists, about half of the cycles start a second process on the same run while the first holds it, which must
be refused (the run folder's lock). After its cycles a trial runs the command to the end. Then every checkpoint of every trial is compared with the same step of an uninterrupted
reference run. Prints a table; the exit status is 1 if any weight differs or a second writer was not refused.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

CONFIG = ["data.train_batch_size=8", "actor.ppo_mini_batch_size=4", "rollout.n=4", "data.arith.val_size=8",
          "trainer.val_before_train=false", "trainer.val_every=0", "trainer.progress=false",
          "logger.backends=[console]", "trainer.save_every=1", "trainer.keep_last_n=0"]
REFUSED = "is in use by another rlforge process"


def command(root: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "rlforge.cli", "fit", *CONFIG, f"trainer.total_steps={steps}",
            f"trainer.runs_root={root}", "trainer.resume=auto"]


def finish(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"run failed ({proc.returncode}): {proc.stderr[-2000:]}")


def started_runs(root: Path) -> list[Path]:
    """The run folders of the experiment that hold a run (a killed start may leave an empty one)."""
    return [p.parent for p in (root / "default").glob("*/config.yaml")]


def holds_run(root: Path, proc: subprocess.Popen) -> bool:
    """Wait until ``proc`` holds a run folder's lock (its pid is in the lock file); False if it exits first."""
    while proc.poll() is None:
        for lock in (root / "default").glob("*/.rlforge.lock"):
            try:
                if json.loads(lock.read_text() or "{}").get("pid") == proc.pid:
                    return True
            except (OSError, ValueError):
                pass
        time.sleep(0.05)
    return False


def kill(proc: subprocess.Popen, after_s: float, stats: dict[str, int], when: str) -> None:
    """SIGKILL ``proc`` after ``after_s`` seconds unless it ends first; counted under ``kills <when>``."""
    try:
        proc.wait(timeout=after_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        stats[f"kills {when}"] += 1


def cycle(cmd: list[str], root: Path, rng: random.Random, max_kill_s: float, stats: dict[str, int]) -> None:
    """Start the command; kill it at a random moment: during start-up (1 in 5), or once it holds the run (during
    a rollout, an update, a checkpoint write...). Once the run exists, every other cycle starts a second copy
    while the first holds the run: it must be refused. (Before the run exists two starts make two new runs.)"""
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if rng.random() < 0.2:
        kill(first, rng.uniform(0.5, 10.0), stats, "in start-up")
    elif holds_run(root, first):
        if started_runs(root) and rng.random() < 0.5:
            second = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            stats["concurrent starts"] += 1
            if REFUSED in second.stderr:
                stats["refused second writers"] += 1
            elif first.poll() is None:  # the second trained while the first still held the run
                stats["unrefused overlaps"] += 1
        kill(first, rng.uniform(0.0, max_kill_s), stats, "while training")
    _, err = first.communicate()
    if first.returncode not in (0, -signal.SIGKILL):
        sys.exit(f"unexpected exit {first.returncode}: {err[-2000:]}")
    stats["cycles"] += 1


def weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"step_{step:06d}" / "actor" / "model.safetensors"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10, help="kill/resume cycles in all (split over the trials)")
    parser.add_argument("--trials", type=int, default=2, help="independent killed runs")
    parser.add_argument("--steps", type=int, default=16, help="training steps of each run")
    parser.add_argument("--max-kill-s", type=float, default=12.0,
                        help="latest moment of a kill after the process took the run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="kill_resume_"))
    start = time.perf_counter()
    finish(command(work / "reference", args.steps))
    (reference,) = (work / "reference" / "default").iterdir()
    stats = dict.fromkeys(["cycles", "kills in start-up", "kills while training", "concurrent starts", "refused second writers", "unrefused overlaps",
                           "checkpoints compared", "mismatches"], 0)
    for trial in range(args.trials):
        root = work / f"trial{trial}"
        cmd = command(root, args.steps)
        for _ in range(args.cycles // args.trials + (trial < args.cycles % args.trials)):
            cycle(cmd, root, rng, args.max_kill_s, stats)
        finish(cmd)
        runs = started_runs(root)
        assert len(runs) == 1, f"trial {trial}: the cycles made {len(runs)} run folders, not one"
        for step in range(1, args.steps + 1):
            a, b = weights(reference, step), weights(runs[0], step)
            stats["checkpoints compared"] += 1
            stats["mismatches"] += int(a.keys() != b.keys() or any(not torch.equal(a[k], b[k]) for k in a))
    print("| " + " | ".join(stats) + " |")
    print("|" + "---|" * len(stats))
    print("| " + " | ".join(str(v) for v in stats.values()) + " |")
    print(f"({args.trials} trials of {args.steps} steps, seed {args.seed}, {time.perf_counter() - start:.0f} s, {work})")
    return int(stats["mismatches"] > 0 or stats["unrefused overlaps"] > 0)


if __name__ == "__main__":
    sys.exit(main())
