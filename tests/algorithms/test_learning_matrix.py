"""Every algorithm learns: a short run on the built-in task raises the sampled reward.

The longer version (accuracy before/after, more steps) is benchmarks/learning_matrix.py; its latest
figures are in docs/algorithms/README.md.
"""

from __future__ import annotations

import pytest

from rlforge import Trainer, load_config
from rlforge.plugin_manager import PluginManager

ALGOS = PluginManager(autoload=False).registry.algorithm.available()
STEPS, WINDOW = 40, 10


@pytest.mark.slow
@pytest.mark.parametrize("algo", ALGOS)
def test_algorithm_raises_the_reward(tmp_path, algo):
    cfg = load_config(algo, [
        f"trainer.runs_root={tmp_path}", f"trainer.total_steps={STEPS}", "trainer.val_before_train=false",
        "trainer.save_every=0", "trainer.val_every=0", "data.arith.val_size=16", "trainer.progress=false",
        "logger.backends=[]",
    ])
    trainer = Trainer(cfg)
    trainer.fit()
    rewards = [h["critic/score/mean"] for h in trainer.history]
    first, last = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    assert last > first + 0.01, f"{algo}: mean sampled reward {first:.3f} (first {WINDOW} steps) -> {last:.3f}"
