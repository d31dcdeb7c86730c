"""OpenAI's Responses API on the endpoint (``POST <base_url>/responses``) with the real ``openai`` client: a
function-call round trip builds the tool_agent trajectory, reasoning is an output item, streaming sends one text
delta per token, and what the endpoint cannot serve is a 400 naming it."""

from __future__ import annotations

import json

import openai
import pytest

from rlforge import batch as B
from rlforge.hookspecs import hookimpl
from rlforge.plugin_manager import PluginManager
from rlforge.plugins.agent.openai_responses import chat_body
from rlforge.plugins.agent.openai_server import OpenAIAgentLoop
from rlforge.plugins.agent.tools import Calculator
from tests.agent.conftest import Scripted, calculator_then_answer, run_loop

SEEN: dict = {}
TOOL = {"type": "function", "name": "calculator", "description": Calculator.description,
        "parameters": Calculator.parameters}


def client(endpoint):
    return openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)


class ToolRoundTrip(OpenAIAgentLoop):
    """Calls tools with the Responses API until the model answers, sending the output items back as input."""

    def agent(self, sample, endpoint):
        api, items = client(endpoint), list(sample.messages)
        for _ in range(3):
            reply = api.responses.create(model=endpoint.model, input=items, tools=[TOOL])
            items += [item.model_dump(exclude_none=True) for item in reply.output]
            calls = [item for item in reply.output if item.type == "function_call"]
            if not calls:
                SEEN["usage"] = (reply.usage.input_tokens, reply.usage.output_tokens, reply.status)
                return reply.output_text
            for call in calls:
                items.append({"type": "function_call_output", "call_id": call.call_id,
                              "output": Calculator(None).execute(json.loads(call.arguments), None)})
        return None


class Probe(OpenAIAgentLoop):
    def agent(self, sample, endpoint):
        api = client(endpoint)
        SEEN["errors"] = []
        for kwargs in ({"previous_response_id": "resp_1"}, {"tools": [{"type": "web_search"}]},
                       {"input": [{"type": "input_image", "image_url": "x"}]}, {"reasoning": {"effort": "low"}}):
            try:
                api.responses.create(model=endpoint.model, **{"input": "2+3?", **kwargs})
            except openai.BadRequestError as exc:
                SEEN["errors"].append(exc.body["message"])
        reply = api.responses.create(model=endpoint.model, input="2+3?", instructions="Be brief.",
                                     max_output_tokens=1)
        SEEN["cut"] = (reply.status, reply.incomplete_details.reason, reply.output_text)
        return None


class Streamed(OpenAIAgentLoop):
    def agent(self, sample, endpoint):
        events = list(client(endpoint).responses.create(model=endpoint.model, input=sample.messages, stream=True))
        SEEN["events"] = [e.type for e in events]
        SEEN["deltas"] = [e.delta for e in events if e.type == "response.output_text.delta"]
        output = events[-1].response.output
        SEEN["final"] = [(i.type, getattr(i, "content", None) and i.content[0].text) for i in output]
        return events[-1].response.output_text


class Plugin:
    @hookimpl
    def rlforge_register(self, registry):
        registry.agent_loop.register("responses_tools", ToolRoundTrip)
        registry.agent_loop.register("responses_probe", Probe)
        registry.agent_loop.register("responses_stream", Streamed)


@pytest.fixture(scope="module")
def agent_pm():
    pm = PluginManager(autoload=False)
    pm.register(Plugin(), name="responses_agents")
    return pm


def test_a_function_call_round_trip_builds_the_tool_agent_trajectory(agent_pm, tok):
    out, metrics = run_loop(agent_pm, tok, "responses_tools", Scripted(tok, calculator_then_answer))
    assert tok.decode(out[B.PROMPTS][0]) == "<|system|>tools: calculator<|end|><|user|>2+3?<|end|><|assistant|>"
    assert out[B.RESPONSE_MASK][0].tolist() == [1] * 82 + [0] * 11 + [1] * 2  # as tool_agent builds it
    assert out[B.SOLUTION_TEXT] == ["5"] and SEEN["usage"] == (26 + 93, 2, "completed")  # prompt + the turns before
    assert metrics["agent/tool_calls"] == 1 and metrics["agent/restarts/mean"] == 0  # the items sent back: no edit


def test_what_the_endpoint_cannot_serve_is_a_400_naming_it(agent_pm, tok):
    out, _ = run_loop(agent_pm, tok, "responses_probe", Scripted(tok, lambda _: "42"))
    assert SEEN["errors"] == [
        "Unsupported request fields: previous_response_id (not supported by the rlforge endpoint)",
        "tools[0]: only function tools are served, got 'web_search' (hosted tools such as web_search run on "
        "OpenAI's servers)",
        "input[0]: items of type 'input_image' are not served (message, function_call, function_call_output and "
        "reasoning are)",
        "Unsupported request fields: reasoning (not supported by the rlforge endpoint)"]
    assert SEEN["cut"] == ("incomplete", "max_output_tokens", "4")
    assert tok.decode(out[B.PROMPTS][0]) == "<|system|>Be brief.<|end|><|user|>2+3?<|end|><|assistant|>"


def test_streaming_sends_one_text_delta_per_token_and_the_reasoning_item(agent_pm, tok):
    out, _ = run_loop(agent_pm, tok, "responses_stream", Scripted(tok, lambda _: "<think>a</think>42"))
    assert SEEN["deltas"] == ["4", "2"] and SEEN["final"] == [("reasoning", "a"), ("message", "42")]
    assert SEEN["events"][0] == "response.created" and SEEN["events"][-1] == "response.completed"
    assert out[B.SOLUTION_TEXT] == ["42"]


def test_input_items_become_chat_messages():
    body = chat_body({"instructions": "sys", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "2+3?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me add."}]},
        {"type": "function_call", "call_id": "c1", "name": "calculator", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "calculator", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "5"}], "max_output_tokens": 9, "include": []})
    assert body == {"max_tokens": 9, "messages": [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "Let me add.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"}]}
