"""Learning matrix: every registered algorithm trains on the built-in task; reward and accuracy before/after.

    python benchmarks/learning_matrix.py --steps 100 [--algos grpo ppo ...] [--out learning_matrix.json]

Prints a markdown table (docs/algorithms/README.md keeps the latest figures) and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from rlforge import Trainer, load_config
from rlforge.plugin_manager import PluginManager


def run(algo: str, steps: int, extra: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(algo, [f"trainer.runs_root={tmp}", f"trainer.total_steps={steps}", "trainer.val_every=0",
                                 "trainer.save_every=0", "trainer.progress=false", "logger.backends=[]", *extra])
        start = time.perf_counter()
        trainer = Trainer(cfg)
        summary = trainer.fit()
        rewards = [h["critic/score/mean"] for h in trainer.history]
        k = max(1, min(15, len(rewards) // 4))
        return {
            "reward_first": sum(rewards[:k]) / k, "reward_last": sum(rewards[-k:]) / k,
            "acc_before": summary["accuracy_before"], "acc_after": summary["accuracy_after"],
            "seconds": time.perf_counter() - start,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--algos", nargs="*", default=None)
    parser.add_argument("--out", default="learning_matrix.json")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    algos = args.algos or PluginManager().registry.algorithm.available()
    results = {}
    print("| algorithm | sampled reward first -> last | greedy accuracy before -> after | seconds |")
    print("|---|---|---|---|")
    for algo in algos:
        r = results[algo] = run(algo, args.steps, args.overrides)
        print(f"| {algo} | {r['reward_first']:.3f} -> {r['reward_last']:.3f} | "
              f"{100 * r['acc_before']:.1f}% -> {100 * r['acc_after']:.1f}% | {r['seconds']:.0f} |", flush=True)
    with open(args.out, "w") as fh:
        json.dump({"steps": args.steps, "overrides": args.overrides, "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
