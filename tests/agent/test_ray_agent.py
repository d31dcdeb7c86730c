"""Agent loops with the Ray controller: the driver runs the loops, each wave of requests is split over the actor
ranks' engines (2 ranks, FSDP over gloo, the shipped tiny model)."""

from __future__ import annotations

import os

import pytest

from rlforge import Trainer, load_config

ray = pytest.importorskip("ray", reason="the Ray controller needs ray (scripts/test.sh installs it)")
pytestmark = pytest.mark.slow


def test_agent_loop_on_two_ray_ranks(tmp_path):
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cfg = load_config("grpo", [
        "trainer.controller=ray", "strategy.name=fsdp", "strategy.num_processes=2", "strategy.device=cpu",
        "ray.num_cpus=2", "data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "rollout.n=2",
        "data.arith.train_size=512", "data.arith.val_size=4", "trainer.val_every=0", "trainer.progress=false", "trainer.val_before_train=false",
        "trainer.total_steps=1", "logger.backends=[console]", "rollout.max_new_tokens=40",
        "rollout.agent.loop=interaction", "rollout.agent.interaction=arith_tutor", f"trainer.runs_root={tmp_path}"])
    trainer = Trainer(cfg)
    try:
        assert trainer.fit()["steps"] == 1
    finally:
        if ray.is_initialized():
            ray.shutdown()
    metrics = trainer.history[-1]
    assert metrics["agent/model_turns/mean"] >= 1 and "actor/pg_loss" in metrics
