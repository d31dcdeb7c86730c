"""How much a short learning run's result moves from seed to seed: the bar of the suite's learning tests.

    .venv/bin/python benchmarks/seed_spread.py --steps 60 [key=value ...] --seeds 0 1 2 3

For each seed (``trainer.seed``), one GRPO run on the built-in task, then the greedy validation accuracy before and
after, and the mean sampled reward of the first and last ``--window`` steps. Prints one JSON line per seed and a
summary (mean and the smallest gain): a test's bar must sit well below the smallest gain and well above zero.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time


def run(seed: int, steps: int, window: int, overrides: list[str]) -> dict[str, float]:
    from rlforge import Trainer, load_config

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config("grpo", [f"trainer.runs_root={tmp}", f"trainer.total_steps={steps}", f"trainer.seed={seed}",
                                   "trainer.val_every=0", "trainer.save_every=0", "trainer.progress=false",
                                   "logger.backends=[console]", *overrides])
        start = time.perf_counter()
        trainer = Trainer(cfg)
        summary = trainer.fit()
        rewards = [h["critic/score/mean"] for h in trainer.history]
        return {"seed": seed, "steps": steps, "seconds": round(time.perf_counter() - start, 1),
                "accuracy_before": summary["accuracy_before"], "accuracy_after": summary["accuracy_after"],
                "accuracy_gain": summary["accuracy_after"] - summary["accuracy_before"],
                "reward_first": sum(rewards[:window]) / window, "reward_last": sum(rewards[-window:]) / window,
                "reward_gain": (sum(rewards[-window:]) - sum(rewards[:window])) / window}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    results = []
    for seed in args.seeds:
        results.append(run(seed, args.steps, args.window, args.overrides))
        print(json.dumps(results[-1]), flush=True)
    for key in ("accuracy_gain", "reward_gain"):
        values = [r[key] for r in results]
        print(f"{key}: mean {statistics.mean(values):.3f}, min {min(values):.3f}, max {max(values):.3f}, "
              f"stdev {statistics.stdev(values) if len(values) > 1 else 0:.3f}")


if __name__ == "__main__":
    main()
