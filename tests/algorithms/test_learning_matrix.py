"""Every RL algorithm trains and learns. (The offline preference algorithms have no sampled reward: their tests are in
test_preference_algos.py.)

- In the default suite: every algorithm runs two steps of its own flow on a small batch; the losses are finite and the
  weights move. That each one *learns* is the job of the math's unit tests plus the learning tests of the suite (one
  synchronous GRPO run, one lagged pipeline, one preference run).
- In the learning matrix (``scripts/test.sh --learning-matrix``, docs/testing.md): a 40-step run of each on the
  built-in task raises the sampled reward. The longer version (accuracy before/after, more steps) is
  benchmarks/learning_matrix.py; its latest figures are in docs/algorithms/README.md.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlforge import Stage, Trainer, hookimpl, load_config
from rlforge.plugin_manager import PluginManager
from rlforge.testing import fast_config
from tests.algorithms.test_learning_new_algorithms import CASES, OWN_TESTS
from tests.algorithms.test_new_algorithms import SMOKE

_PM = PluginManager(autoload=False)
ALGOS = [a for a in _PM.registry.algorithm.available()
         if Stage.ROLLOUT in _PM.registry.algorithm.get(a)(load_config(a, plugins=_PM)).flow()]
STEPS, WINDOW = 40, 10
# the algorithms of issue 30 have their own one-step runs of their variants (test_new_algorithms.py::SMOKE)
SMOKED = {algo for algo, _ in SMOKE.values()}
# ... and learning runs of their own, with the settings their scale needs (VAPO's lam_alpha for 8-token answers) and
# the score they must raise (PF-PPO's before its resampling), or a test of their own (PRIME, OPD):
# test_learning_new_algorithms.py
OWN_LEARNING_TEST = {algo for algo, _ in CASES.values()} | OWN_TESTS


class WeightDelta:
    """Records how far the actor's weights moved between fit start and fit end."""

    def __init__(self) -> None:
        self.start: dict[str, torch.Tensor] = {}
        self.moved = 0.0

    @hookimpl
    def rlforge_fit_start(self, module) -> None:
        self.start = {k: v.detach().clone() for k, v in module.actor.state_dict().items()}

    @hookimpl
    def rlforge_fit_end(self, module) -> None:
        now = module.actor.state_dict()
        self.moved = sum(float((now[k] - v).abs().sum()) for k, v in self.start.items())


ROLE_BATCHES = {"prime": ("algorithm.prm.ppo_mini_batch_size=2",)}  # its PRM's mini-batch divides the 4 prompts too


@pytest.mark.parametrize("algo", [a for a in ALGOS if a not in SMOKED])
def test_algorithm_trains_two_steps(tmp_path, algo):
    delta = WeightDelta()
    trainer = Trainer(fast_config(algo, tmp_path, "trainer.total_steps=2", "data.train_batch_size=4", "rollout.n=2",
                                  "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size=4",
                                  "critic.ppo_mini_batch_size=2", *ROLE_BATCHES.get(algo, ())), callbacks=[delta])
    trainer.fit()
    assert [h["step"] for h in trainer.history] == [1, 2]
    losses = [v for h in trainer.history for k, v in h.items() if k.endswith("_loss")]
    assert losses and all(math.isfinite(v) for v in losses), (algo, trainer.history)
    assert delta.moved > 0, f"{algo}: two steps left the actor's weights unchanged"


@pytest.mark.learning_matrix
@pytest.mark.parametrize("algo", [a for a in ALGOS if a not in OWN_LEARNING_TEST])
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
