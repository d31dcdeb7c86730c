"""Limits (turns, response tokens, tokens per turn) and bad input: a loop that raises or returns junk, an interaction
that returns junk, a prompt that no longer fits with the tool schemas, an engine that fails."""

from __future__ import annotations

import re

import pytest

import rlforge
from rlforge import batch as B
from rlforge.agent import AgentLoop, AgentLoopError, Interaction, Trajectory
from rlforge.build import Builder
from rlforge.hookspecs import hookimpl
from rlforge.plugin_manager import PluginManager
from tests.agent.conftest import CALL, Scripted, calculator_then_answer, prompt_batch, sampling


def always_call(_text: str) -> str:
    return CALL


def test_turn_limit_stops_before_running_the_last_turns_tools(make_runner, tok):
    runner, _ = make_runner("rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]",
                            "rollout.agent.max_turns=2", "rollout.max_new_tokens=192")
    out, metrics = runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(), Scripted(tok, always_call))
    assert out[B.RESPONSE_MASK][0].tolist()[-1] == 1  # ends on a model turn: no tool reply after it
    assert metrics["agent/model_turns/max"] == 2 and metrics["tool_call_counts/max"] == 1
    assert metrics["agent/turn_limit_ratio"] == 1.0 and metrics["agent/token_limit_ratio"] == 0.0


def test_token_budget_leaves_out_a_reply_that_does_not_fit(make_runner, tok):
    # turn 1 is 82 tokens; the tool reply (11 tokens) would leave no room for a model turn within 92
    runner, _ = make_runner("rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]", "rollout.max_new_tokens=92")
    out, metrics = runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(max_new_tokens=92),
                                  Scripted(tok, calculator_then_answer))
    assert out[B.RESPONSE_MASK][0].tolist() == [1] * 82
    assert metrics["agent/token_limit_ratio"] == 1.0


def test_budget_caps_each_request_and_the_whole_response(make_runner, tok):
    runner, _ = make_runner("rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]",
                            "rollout.max_new_tokens=100")
    scripted = Scripted(tok, calculator_then_answer)
    out, _ = runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(max_new_tokens=100), scripted)
    assert [p.max_new_tokens for p in scripted.params] == [100, 100 - 82 - 11]
    assert out[B.RESPONSE_MASK].shape[1] <= 100


def test_turn_cut_by_max_tokens_per_turn_is_closed_and_answered_with_a_parse_error(make_runner, tok):
    runner, _ = make_runner("rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]",
                            "rollout.agent.max_tokens_per_turn=15", "rollout.agent.max_turns=2",
                            "data.max_prompt_length=32", "rollout.max_new_tokens=224")
    scripted = Scripted(tok, always_call)
    out, metrics = runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(), scripted)
    assert {p.max_new_tokens for p in scripted.params} == {15}
    text = tok.decode(out[B.RESPONSES][0])
    # the cut turn gets the template's end marker (inserted, mask 0) before the error reply
    assert text.startswith('<tool_call>{"na<|end|><|tool|>Error: the tool call could not be read: a <tool_call> has no')
    mask = out[B.RESPONSE_MASK][0].tolist()
    assert mask[:15] == [1] * 15 and mask[15] == 0
    assert metrics["agent/parse_errors"] == 1 and metrics["agent/turn_limit_ratio"] == 1.0


# --- failing loops, interactions and engines --------------------------------------------------------


class Boom(AgentLoop):
    async def run(self, sample, engine):
        conv = self.conversation(sample)
        await conv.generate(engine)
        await conv.generate(engine)
        raise RuntimeError("the agent is confused")


class Junk(AgentLoop):
    async def run(self, sample, engine):
        return {"response": [1, 2]}


class Lopsided(AgentLoop):
    async def run(self, sample, engine):
        return Trajectory([1, 2], [3, 4], [1], [0.0, 0.0])


class BadValues(AgentLoop):
    """Finishes with the value of the ``extra_info``-free class attribute ``bad`` (set per test)."""

    bad: dict = {}

    async def run(self, sample, engine):
        conv = self.conversation(sample)
        await conv.generate(engine)
        return conv.finish(**self.bad)


class Rude(Interaction):
    def step(self, message):
        return "fine"


class TestLoops:
    @hookimpl
    def rlforge_register(self, registry):
        registry.agent_loop.register("boom", Boom)
        registry.agent_loop.register("junk", Junk)
        registry.agent_loop.register("lopsided", Lopsided)
        registry.agent_loop.register("bad_values", BadValues)
        registry.interaction.register("rude", Rude)


@pytest.fixture(scope="module")
def test_pm():
    pm = PluginManager(autoload=False)
    pm.register(TestLoops(), name="testloops")
    return pm


def runner_for(test_pm, tok, *overrides):
    cfg = rlforge.load_config("grpo", ["data.max_prompt_length=64", "rollout.max_new_tokens=100", *overrides],
                              plugins=test_pm)
    return Builder(cfg, test_pm).agent(tok)


def rollout(runner, tok, reply=lambda _: "5"):
    return runner.rollout(prompt_batch(tok, [("2+3?", "5"), ("1+1?", "2")]), sampling(n=2), Scripted(tok, reply))


def test_a_loop_that_raises_names_the_loop_the_sample_and_the_turn(test_pm, tok):
    with pytest.raises(AgentLoopError) as info:
        rollout(runner_for(test_pm, tok, "rollout.agent.loop=boom"), tok)
    message = str(info.value)
    assert "Agent loop 'boom' (rollout.agent.loop) failed on sample" in message
    assert "data_source 'arith'" in message and "at turn 2: RuntimeError: the agent is confused" in message


@pytest.mark.parametrize("loop, reason", [
    ("junk", "before its first turn: TypeError: run() returned dict, not a rlforge.agent.Trajectory"),
    ("lopsided", "response_ids, response_mask and log_probs have lengths 2, 1, 2"),
])
def test_a_loop_that_returns_junk_fails_clearly(test_pm, tok, loop, reason):
    with pytest.raises(AgentLoopError, match=f"Agent loop '{loop}'.*{reason}".replace("(", r"\(").replace(")", r"\)")):
        rollout(runner_for(test_pm, tok, f"rollout.agent.loop={loop}"), tok)


@pytest.mark.parametrize("bad, reason", [
    ({"reward": "x"}, "reward is 'x'; it must be a finite number"),
    ({"reward": float("nan")}, "reward is nan; it must be a finite number"),
    ({"metrics": {"m": "notanumber"}}, "metrics['m'] is 'notanumber'; it must be a finite number"),
    ({"answer": 12345}, "answer is int (12345), not a str"),
])
def test_a_loop_that_finishes_with_bad_values_fails_clearly(test_pm, tok, monkeypatch, bad, reason):
    monkeypatch.setattr(BadValues, "bad", bad)
    with pytest.raises(AgentLoopError, match="Agent loop 'bad_values'.*at turn 1: ValueError: " + re.escape(reason)):
        rollout(runner_for(test_pm, tok, "rollout.agent.loop=bad_values"), tok)


def test_an_interaction_that_returns_junk_fails_clearly(test_pm, tok):
    runner = runner_for(test_pm, tok, "rollout.agent.loop=interaction", "rollout.agent.interaction=rude")
    with pytest.raises(AgentLoopError, match=r"at turn 1: TypeError: the interaction's step\(\) returned 'fine'"):
        rollout(runner, tok)


def test_prompt_over_the_limit_with_tool_schemas(make_runner, tok):
    runner, _ = make_runner("rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]",
                            "data.max_prompt_length=30")
    batch = prompt_batch(tok, [("What is 12+30?", "42")], max_len=30)
    with pytest.raises(AgentLoopError, match="the prompt with the tool schemas is 36 tokens, over "
                                             "data.max_prompt_length=30"):
        runner.rollout(batch, sampling(), Scripted(tok, calculator_then_answer))


def test_an_engine_error_fails_the_run_with_the_loop_and_turn(make_runner, tok):
    runner, _ = make_runner("rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]")

    def broken(prompts, params):
        raise RuntimeError("engine died")

    with pytest.raises(AgentLoopError, match="'tool_agent'.*at turn 1: RuntimeError: engine died"):
        runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(), broken)

