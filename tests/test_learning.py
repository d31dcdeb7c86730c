"""RL that does not learn is a bug: a short GRPO run on the shipped base model must raise the reward and the greedy
validation accuracy.

The bars come from the seed-to-seed spread (``benchmarks/seed_spread.py``, 2026-12-01, this 2-core CPU kind):
- 100 steps, seeds 0 and 1: greedy accuracy 16.5% -> 27.5% / 28.0% (+11.0 / +11.5 points), mean sampled reward of
  the first and last 10 steps +0.096 / +0.111;
- 60 steps, seeds 0-3: accuracy +10.5 / +1.0 / +7.5 / +5.5 points, reward +0.063 / +0.029 / +0.054 / +0.070: too
  short, one seed barely moves the accuracy.
With no learning the reward windows differ by about 0.01 (256 samples a step, 10 steps a window) and the accuracy
on 200 questions by about 3 points. The bars below are half the smallest gain seen at 100 steps.
"""

from __future__ import annotations

import pytest

from rlforge import Trainer, load_config

STEPS, WINDOW = 100, 10


@pytest.mark.slow
def test_grpo_learns_on_builtin_task(tmp_path):
    cfg = load_config("grpo", [
        f"trainer.runs_root={tmp_path}", f"trainer.total_steps={STEPS}", "trainer.val_every=0", "trainer.save_every=0",
        "trainer.progress=false", "logger.backends=[console]",
    ])
    trainer = Trainer(cfg)
    summary = trainer.fit()
    rewards = [h["critic/score/mean"] for h in trainer.history]
    first, last = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    assert last > first + 0.045, (first, last)
    assert summary["accuracy_after"] >= summary["accuracy_before"] + 0.05, summary
