"""Agents written with agent libraries the usual way, trained through rlforge's OpenAI endpoint: the OpenAI Agents SDK
(``openai-agents``: its default Responses model, streamed or not, and its chat-completions model) and LangGraph
(``create_react_agent`` over ``langchain-openai``'s ``ChatOpenAI``). Each defines the calculator as its library does
(``@function_tool``, ``@tool``) and runs it itself; one GRPO step of the shipped tool-calling model
``builtin:tiny-agent`` on ``arith_tool`` (sampled, so its calls are its own) must include calls the model wrote and
the library ran, as the trajectory record shows. Both libraries are optional dependencies that the test extra
installs (a test without them skips, which the suite's strict-skip mode counts as a failure)."""

from __future__ import annotations

import pytest

import rlforge
from rlforge import batch as B
from rlforge.agent.record import RECORD_FILE, read_records
from rlforge.trainer.report import print_trajectory
from tests.agent.conftest import Scripted, calculator_then_answer, prompt_batch, runner_for, sampling

pytestmark = pytest.mark.slow
MODULE = __name__  # the entries below: rollout.agent.openai_agent.entry=tests.agent.test_agent_libraries:...


def _calculate(expression: str) -> str:
    from rlforge.plugins.agent.tools import Calculator

    return Calculator(None).execute({"expression": expression}, None)


async def agents_sdk_agent(sample, endpoint):
    """The OpenAI Agents SDK: an Agent with a function tool on the endpoint's chat-completions API."""
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
    from openai import AsyncOpenAI

    @function_tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return _calculate(expression)

    client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    agent = Agent(name="calculator agent", model=OpenAIChatCompletionsModel(model=endpoint.model,
                                                                            openai_client=client),
                  tools=[calculator])
    result = await Runner.run(agent, sample.messages[-1]["content"], max_turns=4,
                              run_config=RunConfig(tracing_disabled=True))  # no trace upload: there is no network
    return result.final_output


async def agents_sdk_responses_agent(sample, endpoint):
    """The Agents SDK's default model: OpenAI's Responses API, on the trajectory's client."""
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.models.openai_provider import OpenAIProvider
    from openai import AsyncOpenAI

    @function_tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return _calculate(expression)

    client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    result = await Runner.run(Agent(name="calculator agent", model=endpoint.model, tools=[calculator]),
                              sample.messages[-1]["content"], max_turns=4,
                              run_config=RunConfig(tracing_disabled=True,
                                                   model_provider=OpenAIProvider(openai_client=client)))
    return result.final_output


async def agents_sdk_streaming_agent(sample, endpoint):
    """The Responses agent, streamed (``Runner.run_streamed``: every request with ``stream=true``)."""
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.models.openai_provider import OpenAIProvider
    from openai import AsyncOpenAI

    @function_tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return _calculate(expression)

    client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    result = Runner.run_streamed(Agent(name="calculator agent", model=endpoint.model, tools=[calculator]),
                                 sample.messages[-1]["content"], max_turns=4,
                                 run_config=RunConfig(tracing_disabled=True,
                                                      model_provider=OpenAIProvider(openai_client=client)))
    async for _ in result.stream_events():
        pass
    return result.final_output


def langgraph_agent(sample, endpoint):
    """LangGraph's prebuilt ReAct agent on langchain-openai's ChatOpenAI (a sync agent: rlforge runs it in a thread)."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    @tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return _calculate(expression)

    llm = ChatOpenAI(model=endpoint.model, base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    state = create_react_agent(llm, [calculator]).invoke({"messages": sample.messages}, {"recursion_limit": 8})
    return state["messages"][-1].content


AGENTS = {
    "agents_sdk": ("agents", "agents_sdk_agent"),
    "agents_sdk_responses": ("agents", "agents_sdk_responses_agent"),
    "agents_sdk_streaming": ("agents", "agents_sdk_streaming_agent"),
    "langgraph": ("langgraph", "langgraph_agent"),
}


def entry_of(name: str) -> str:
    """``rollout.agent.openai_agent.entry`` of an agent of ``AGENTS`` (the test skips without its library)."""
    library, function = AGENTS[name]
    pytest.importorskip(library)
    if library == "langgraph":
        pytest.importorskip("langchain_openai")
    return f"{MODULE}:{function}"


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_the_library_agent_builds_the_tool_agent_trajectory(pm, tok, name):
    """On a scripted model: the library ran the call and sent its reply back; the trajectory is token for token the
    one the built-in tool_agent loop builds (tool call, inserted tool reply, answer)."""
    runner = runner_for(pm, tok, "rollout.agent.loop=openai_agent",
                        f"rollout.agent.openai_agent.entry={entry_of(name)}")
    try:
        ours, metrics = runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(),
                                       Scripted(tok, calculator_then_answer))
    finally:
        runner.close()
    assert tok.decode(ours[B.RESPONSES][0]) == ('<tool_call>{"name": "calculator", "arguments": {"expression": '
                                                '"2+3"}}</tool_call><|end|><|tool|>5<|end|><|assistant|>5<|end|>')
    assert tok.decode(ours[B.PROMPTS][0]) == "<|system|>tools: calculator<|end|><|user|>2+3?<|end|><|assistant|>"
    assert ours[B.SOLUTION_TEXT] == ["5"]
    assert metrics["agent/tool_calls"] == 1 and metrics["agent/restarts/mean"] == 0


@pytest.mark.parametrize("name", ["agents_sdk_responses", "langgraph"])
def test_one_grpo_step_of_the_tiny_agent_through_the_library(tmp_path, name, capsys):
    cfg = rlforge.load_config("grpo", [
        f"trainer.runs_root={tmp_path}", "trainer.total_steps=1", "trainer.val_every=0", "trainer.save_every=0",
        "trainer.val_before_train=false", "trainer.progress=false", "logger.backends=[console]",
        "data.train_batch_size=2", "rollout.n=4", "actor.ppo_mini_batch_size=2", "data.arith_tool.val_size=1",
        "rollout.agent.wave_wait_s=60",  # above tool_timeout_s: waves never depend on timing, the samples are seeded
        "rollout.val_n=1", "rollout.agent.loop=openai_agent", f"rollout.agent.openai_agent.entry={entry_of(name)}",
        "rollout.agent.record_trajectories=true"], config_file="builtin:agentic")
    trainer = rlforge.Trainer(cfg)
    assert trainer.fit()["steps"] == 1
    metrics = trainer.history[-1]
    assert metrics["agent/tool_calls"] >= 1 and "actor/pg_loss" in metrics  # 8 sampled trajectories
    records = read_records(trainer.run_dir / RECORD_FILE)
    assert len(records) == 8 and {r["policy_version"] for r in records} == {0}
    called = [r for r in records if any(s["role"] == "tool" for s in r["spans"])]
    assert called, "no trajectory with a tool reply"
    record = called[0]
    model, tool = record["spans"][0], record["spans"][1]
    assert model["role"] == "assistant" and model["tool_calls"][0]["name"] == "calculator"
    assert tool["messages"][0]["role"] == "tool" and tool["messages"][0]["tool_call_id"]
    mask = record["loss_mask"]
    assert set(mask[model["start"]:model["end"]]) == {1} and set(mask[tool["start"]:tool["end"]]) == {0}
    expression = model["tool_calls"][0]["arguments"]["expression"]
    assert tool["messages"][0]["content"] == _calculate(expression)  # the library ran the model's call
    print_trajectory(record)
    shown = capsys.readouterr().out
    assert "tool call calculator" in shown and "policy version 0" in shown
