"""Every RL algorithm learns: a short run on the built-in task raises the sampled reward. (The offline preference
algorithms have no sampled reward: their learning tests are in test_preference_algos.py.)

The longer version (accuracy before/after, more steps) is benchmarks/learning_matrix.py; its latest
figures are in docs/algorithms/README.md.
"""

from __future__ import annotations

import pytest

from rlforge import Stage, Trainer, load_config
from rlforge.plugin_manager import PluginManager

_PM = PluginManager(autoload=False)
ALGOS = [a for a in _PM.registry.algorithm.available()
         if Stage.ROLLOUT in _PM.registry.algorithm.get(a)(load_config(a, plugins=_PM)).flow()]
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
