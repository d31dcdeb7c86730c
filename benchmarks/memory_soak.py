"""Memory soak: many GRPO steps on the tiny model; resident memory must stay flat.

    python benchmarks/memory_soak.py --steps 500 [--out memory_soak.json] [key=value ...]

Records RSS (from /proc/self/status) after steps 1, 10%, ..., 100% and writes JSON; the summary goes to
docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile

from rlforge import Trainer, hookimpl, load_config


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("VmRSS not found in /proc/self/status")


class RSSRecorder:
    def __init__(self, every: int) -> None:
        self.every = every
        self.samples: list[tuple[int, float]] = []

    @hookimpl
    def rlforge_step_end(self, step: int) -> None:
        if step == 1 or step % self.every == 0:
            self.samples.append((step, rss_mb()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--out", default="memory_soak.json")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    recorder = RSSRecorder(max(1, args.steps // 10))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config("grpo", [
            f"trainer.runs_root={tmp}", f"trainer.total_steps={args.steps}", "trainer.val_every=0",
            "trainer.save_every=100", "trainer.progress=false", "logger.backends=[mlflow]",
            "data.train_batch_size=8", "data.arith.val_size=16", *args.overrides,
        ])
        Trainer(cfg, callbacks=[recorder]).fit()
    (first_step, first), (last_step, last) = recorder.samples[0], recorder.samples[-1]
    result = {"steps": args.steps, "rss_mb": recorder.samples, "growth_mb": last - first}
    print(f"RSS after step {first_step}: {first:.0f} MB; after step {last_step}: {last:.0f} MB "
          f"({last - first:+.0f} MB)")
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
