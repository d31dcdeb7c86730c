"""Random kill -9 / resume cycles against an uninterrupted run: the final weights must match bit for bit.

    python benchmarks/kill_resume.py --cycles 10 [--trials 2] [--steps 8] [--seed 0] [--workdir DIR]

Each trial trains one run of ``--steps`` steps on the tiny model through the real CLI
(``rlforge fit ... trainer.resume=auto``, a checkpoint after every step, all kept). Each cycle starts the
command and sends ``SIGKILL`` at a random moment (start-up, rollout, update, checkpoint writing: wherever
it lands); about half of the cycles start a second process on the same run a moment later, which must be
refused (the run folder's lock) while the first one holds the run. After its cycles a trial runs the command
to the end. Then every checkpoint of every trial is compared with the same step of an uninterrupted
reference run. Prints a table; the exit status is 1 if any weight differs or a second writer was not refused.
"""

from __future__ import annotations

import argparse
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


def cycle(cmd: list[str], root: Path, rng: random.Random, max_kill_s: float, stats: dict[str, int]) -> None:
    """Start the command (and, once the run exists, maybe a second copy), kill the first at a random moment,
    wait for both. (Before the run exists, two starts rightly make two new runs.)"""
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    second = None
    if started_runs(root) and rng.random() < 0.5:
        time.sleep(rng.uniform(0.0, 2.0))
        second = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        first.wait(timeout=rng.uniform(1.0, max_kill_s))
    except subprocess.TimeoutExpired:
        first.send_signal(signal.SIGKILL)
        stats["kills"] += 1
    _, err1 = first.communicate()
    if second is not None:
        if second.poll() is None:  # it got the run (the first was killed before taking it): kill it too
            try:
                second.wait(timeout=rng.uniform(1.0, max_kill_s))
            except subprocess.TimeoutExpired:
                second.send_signal(signal.SIGKILL)
                stats["kills"] += 1
        _, err2 = second.communicate()
        refused = [REFUSED in e for e in (err1 or "", err2 or "")]
        stats["concurrent starts"] += 1
        stats["refused second writers"] += sum(refused)
        # both ran to completion or both were killed after taking the run: only possible without the lock
        stats["unrefused overlaps"] += int(first.returncode == second.returncode == 0)
    for proc, err in ((first, err1),) + (((second, err2),) if second is not None else ()):
        if proc.returncode not in (0, -signal.SIGKILL) and REFUSED not in (err or ""):
            sys.exit(f"unexpected exit {proc.returncode}: {(err or '')[-2000:]}")
    stats["cycles"] += 1


def weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"step_{step:06d}" / "actor" / "model.safetensors"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10, help="kill/resume cycles in all (split over the trials)")
    parser.add_argument("--trials", type=int, default=2, help="independent killed runs")
    parser.add_argument("--steps", type=int, default=8, help="training steps of each run")
    parser.add_argument("--max-kill-s", type=float, default=25.0, help="latest moment of a kill after a start")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="kill_resume_"))
    start = time.perf_counter()
    finish(command(work / "reference", args.steps))
    (reference,) = (work / "reference" / "default").iterdir()
    stats = dict.fromkeys(["cycles", "kills", "concurrent starts", "refused second writers", "unrefused overlaps",
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
