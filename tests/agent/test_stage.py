"""Wiring: the agent kinds in the registries, config and CLI; the flow edit (single_turn keeps today's rollout
stage); the agent reward stage; a controller without token-in/token-out generation."""

from __future__ import annotations

import pytest
import torch

import rlforge
from rlforge import Trainer
from rlforge import batch as B
from rlforge.agent.batching import AGENT_REWARDS
from rlforge.agent.stage import AgentRewardStage, AgentRolloutStage
from rlforge.dataflow import Stage
from rlforge.errors import RLForgeError
from rlforge.testing import fake_controller, step_context

AGENT = ["rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]"]


def test_agent_kinds_are_registered(registry):
    # the agent plugins' components (the environment adapters, plugins/env, register theirs beside them)
    assert {"interaction", "openai_agent", "single_turn", "tool_agent"} <= set(registry.agent_loop.available())
    assert {"calculator", "python"} <= set(registry.tool.available())
    assert {"hermes", "tokenizer"} <= set(registry.tool_parser.available())
    assert "arith_tutor" in registry.interaction.available()


def test_plugins_list_and_config_show(capsys):
    from rlforge.cli import main

    assert main(["plugins", "list"]) == 0
    out = capsys.readouterr().out
    for component in ("agent loop:tool_agent", "tool:calculator", "tool parser:hermes", "interaction:arith_tutor"):
        assert component in out
    assert main(["config", "show", *AGENT, "rollout.agent.calculator.max_digits=12"]) == 0
    shown = capsys.readouterr().out
    assert "loop: tool_agent" in shown and "max_digits: 12" in shown
    assert "rollout.agent.calculator (rlforge.plugins.agent.tools)" in shown


def test_unknown_agent_keys_name_the_key(pm):
    with pytest.raises(rlforge.errors.ConfigError, match="rollout.agent.calculator.max_digit"):
        rlforge.load_config("grpo", ["rollout.agent.calculator.max_digit=3"], plugins=pm)


def _flow(pm, algo, *overrides):
    trainer = Trainer(rlforge.load_config(algo, list(overrides), plugins=pm), plugins=pm)
    return trainer.build_flow(trainer.builder.module())


def test_single_turn_keeps_the_batch_rollout_stage(pm):
    flow = _flow(pm, "grpo")
    assert flow.stages[0] is Stage.ROLLOUT and "agent_reward" not in flow.names()


@pytest.mark.parametrize("algo", ["grpo", "ppo", "dapo", "remax"])
def test_an_agent_loop_replaces_the_rollout_stage_of_every_algorithm(pm, algo):
    flow = _flow(pm, algo, *AGENT)
    names = flow.names()
    assert isinstance(flow.stages[0], AgentRolloutStage) and names[0] == "rollout"
    assert names[names.index("reward") + 1] == "agent_reward"


def test_agent_reward_stage_adds_turn_rewards():
    batch = B.Batch({B.SCORES: torch.tensor([1.0, 0.0]), B.TOKEN_LEVEL_SCORES: torch.tensor([[0, 1.0], [0, 0]]),
                     B.TOKEN_LEVEL_REWARDS: torch.tensor([[0, 0.5], [0, 0]]),
                     AGENT_REWARDS: torch.tensor([[0.5, 0.25], [0, -1.0]])})
    ctx = step_context(None, [batch])
    out = AgentRewardStage().run(ctx, batch)
    assert out[B.SCORES].tolist() == [1.75, -1.0]
    assert out[B.TOKEN_LEVEL_SCORES].tolist() == [[0.5, 1.25], [0, -1.0]]
    assert out[B.TOKEN_LEVEL_REWARDS].tolist() == [[0.5, 0.75], [0, -1.0]]  # after shaping (here 1 -> 0.5)
    assert ctx.metrics["agent/reward/mean"] == pytest.approx(-0.125)


def test_rollout_workers_without_generate_tokens_are_a_clear_error(make_config):
    ctx = step_context(make_config(*AGENT), controller=fake_controller(generate=lambda batch, params: batch))
    with pytest.raises(RLForgeError, match="the rollout workers of the controller SimpleNamespace \\(trainer.controller\\) "
                                           "do not provide \\(generate_tokens\\)"):
        AgentRolloutStage().run(ctx, B.Batch())
