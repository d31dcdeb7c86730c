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


def test_remax_generates_its_greedy_baseline_through_the_agent_loop(tmp_path, monkeypatch):
    calls = []
    rollout = AgentRolloutStage.rollout

    def recorded(self, run, batch, params):
        out, metrics = rollout(self, run, batch, params)
        calls.append((params.n, params.temperature, out.lists.get(B.NUM_TURNS)))
        return out, metrics

    monkeypatch.setattr(AgentRolloutStage, "rollout", recorded)
    cfg = load_config("remax", [*FAST, f"trainer.runs_root={tmp_path}", "rollout.agent.loop=interaction",
                                "rollout.agent.interaction=arith_tutor", "rollout.agent.max_turns=3",
                                "trainer.total_steps=1"])
    assert Trainer(cfg).fit()["steps"] == 1
    sampled, greedy = calls[:2]  # the step's trajectories, then one greedy trajectory per prompt through the loop
    assert sampled[:2] == (2, 1.0) and greedy[:2] == (1, 0.0) and len(greedy[2]) == 4
