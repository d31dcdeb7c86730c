"""End to end on the shipped tiny model: ``rlforge fit`` with ``tool_agent`` + ``calculator``, and a GRPO run with
the ``interaction`` loop whose batches carry holes in the response mask all the way to the update."""

from __future__ import annotations

import json

import pytest

from rlforge import Trainer, hookimpl, load_config
from rlforge import batch as B
from rlforge.agent.stage import AgentRolloutStage

pytestmark = pytest.mark.slow

FAST = ["data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "rollout.n=2", "data.arith.train_size=512", "data.arith.val_size=4",
        "trainer.val_every=0", "trainer.progress=false", "trainer.val_before_train=false", "trainer.total_steps=2",
        "logger.backends=[console]", "rollout.max_new_tokens=40"]


def test_rlforge_fit_with_tool_agent_and_calculator(tmp_path, capsys):
    from rlforge.cli import main

    code = main(["fit", "--algo", "grpo", *FAST, f"trainer.runs_root={tmp_path}", "rollout.agent.loop=tool_agent",
                 "rollout.agent.tools=[calculator]"])
    assert code == 0, capsys.readouterr().err
    summary = json.loads(next(tmp_path.glob("default/*/summary.json")).read_text())
    assert summary["steps"] == 2


class Check:
    def __init__(self):
        self.gaps, self.holes, self.metrics = [], [], []

    @hookimpl
    def rlforge_advantage_end(self, batch):
        diff = (batch[B.ROLLOUT_LOG_PROBS] - batch[B.OLD_LOG_PROBS]).abs() * batch[B.RESPONSE_MASK]
        self.gaps.append(diff.max().item())
        mask = batch[B.RESPONSE_MASK]
        self.holes.append(bool(((mask[:, 1:] - mask[:, :-1]) == 1).any()))

    @hookimpl
    def rlforge_step_end(self, metrics):
        self.metrics.append(metrics)


def test_grpo_with_a_simulated_user(tmp_path):
    check = Check()
    cfg = load_config("grpo", [*FAST, f"trainer.runs_root={tmp_path}", "rollout.agent.loop=interaction",
                               "rollout.agent.interaction=arith_tutor", "rollout.agent.max_turns=3",
                               "actor.reuse_rollout_log_probs=false", "data.train_batch_size=8",
                               "actor.ppo_mini_batch_size=4"])
    trainer = Trainer(cfg, callbacks=[check])
    assert trainer.fit()["steps"] == 2
    assert any(check.holes)  # some trajectories had a second model turn after the tutor's reply
    assert max(check.gaps) < 1e-4  # the engine's log-probs of every model turn are the actor's
    last = check.metrics[-1]
    for key in ("num_turns/mean", "agent/model_turns/max", "agent/turn_limit_ratio", "agent/reward/mean",
                "timing_s/agent_reward", "actor/pg_loss"):
        assert key in last, key
    stage = trainer.flow.stages[0]
    assert isinstance(stage, AgentRolloutStage) and stage.runner is None  # closed at fit end
