"""The OpenAI endpoint with the real ``openai`` client: streaming (sync and async clients, tool calls, usage),
keep-alive, content given as a list of text parts, the sampling policy (the rollout's sampling is applied, any other
is a 400; a native loop asking for another temperature fails), and assistant turns the agent edits."""

from __future__ import annotations

import json

import openai
import pytest

from rlforge import batch as B
from rlforge.agent import AgentLoop, AgentLoopError
from rlforge.hookspecs import hookimpl
from rlforge.plugin_manager import PluginManager
from rlforge.plugins.agent.openai_server import OpenAIAgentLoop
from rlforge.plugins.agent.tools import Calculator
from rlforge.sampling import SamplingParams
from tests.agent.conftest import Scripted, calculator_then_answer, prompt_batch, run_loop, runner_for, sampling

TOOLS = [Calculator(None).schema()]
SEEN: dict[str, list] = {}  # what each agent observed, by loop name


def client(endpoint, cls=openai.OpenAI):
    return cls(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)


def streamed(chunks):
    """The content, tool calls, finish reason and usage assembled from a stream's chunks."""
    content, calls, finish, usage = "", {}, None, None
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                slot = calls.setdefault(call.index, {"id": call.id, "name": "", "arguments": ""})
                slot["name"] += call.function.name or ""
                slot["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, list(calls.values()), finish, usage


class StreamingCalculator(OpenAIAgentLoop):
    """The calculator agent of test_openai.py, every request streamed."""

    def agent(self, sample, endpoint):
        api = client(endpoint)
        messages = list(sample.messages)
        for _ in range(4):
            content, calls, finish, usage = streamed(api.chat.completions.create(
                model=endpoint.model, messages=messages, tools=TOOLS, stream=True,
                stream_options={"include_usage": True}))
            SEEN.setdefault("stream", []).append((finish, usage.completion_tokens))
            messages.append({"role": "assistant", "content": content or None,
                             "tool_calls": [{"id": c["id"], "type": "function",
                                             "function": {"name": c["name"], "arguments": c["arguments"]}}
                                            for c in calls] or None})
            if not calls:
                return content
            for call in calls:
                result = Calculator(None).execute(json.loads(call["arguments"]), None)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        return None


class AsyncStream(OpenAIAgentLoop):
    async def agent(self, sample, endpoint):
        api = client(endpoint, openai.AsyncOpenAI)
        stream = await api.chat.completions.create(model=endpoint.model, messages=sample.messages, stream=True,
                                                   logprobs=True)
        text, logprobs = "", []
        async for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                logprobs += [t.logprob for t in (choice.logprobs.content if choice.logprobs else None) or []]
        SEEN["async_stream"] = logprobs
        return text


class KeepAlive(OpenAIAgentLoop):
    """Two turns and the model list on one client: all on one connection."""

    def agent(self, sample, endpoint):
        api = client(endpoint)
        ports = []
        messages = list(sample.messages)
        for question in ("again?", None):
            raw = api.chat.completions.with_raw_response.create(model=endpoint.model, messages=messages)
            ports.append(raw.http_response.extensions["network_stream"].get_extra_info("client_addr")[1])
            reply = raw.parse().choices[0].message
            messages += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": question}]
        raw = api.models.with_raw_response.list()
        ports.append(raw.http_response.extensions["network_stream"].get_extra_info("client_addr")[1])
        SEEN["ports"] = ports
        return reply.content


class Parts(OpenAIAgentLoop):
    """The same question as a string and as text parts."""

    def agent(self, sample, endpoint):
        api = client(endpoint)
        text = sample.messages[0]["content"]
        usage = []
        for content in (text, [{"type": "text", "text": text}], [{"type": "text", "text": text[:2]},
                                                                  {"type": "text", "text": text[2:]}]):
            reply = api.chat.completions.create(model=endpoint.model, messages=[{"role": "user", "content": content}])
            usage.append(reply.usage.prompt_tokens)
        SEEN["parts"] = usage
        return reply.choices[0].message.content


class Sampler(OpenAIAgentLoop):
    """The rollout's own sampling values are served; another temperature is a 400."""

    def agent(self, sample, endpoint):
        api = client(endpoint)
        try:
            api.chat.completions.create(model=endpoint.model, messages=sample.messages, temperature=0.5)
        except openai.BadRequestError as exc:
            SEEN["sampler"] = [exc.body["message"], exc.body["param"]]
        return api.chat.completions.create(model=endpoint.model, messages=sample.messages, temperature=0.7,
                                           top_p=0.9).choices[0].message.content


class Editor(OpenAIAgentLoop):
    """Sends the reply back edited, then a second time unchanged but re-serialized."""

    def agent(self, sample, endpoint):
        api = client(endpoint)
        first = api.chat.completions.create(model=endpoint.model, messages=sample.messages).choices[0].message
        edited = [*sample.messages, {"role": "assistant", "content": first.content + " (edited)"},
                  {"role": "user", "content": "sure?"}]
        second = api.chat.completions.create(model=endpoint.model, messages=edited).choices[0].message
        same = [*edited, {"role": "assistant", "content": [{"type": "text", "text": second.content}]},
                {"role": "user", "content": "and now?"}]
        return api.chat.completions.create(model=endpoint.model, messages=same).choices[0].message.content


class ReformattedCalls(OpenAIAgentLoop):
    """Sends a tool call back with its arguments re-serialized (other spacing): the same call, no restart."""

    def agent(self, sample, endpoint):
        api = client(endpoint)
        reply = api.chat.completions.create(model=endpoint.model, messages=sample.messages, tools=TOOLS)
        call = reply.choices[0].message.tool_calls[0]
        arguments = json.dumps(json.loads(call.function.arguments), indent=2)
        messages = [*sample.messages,
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                                          "arguments": arguments}}]},
                    {"role": "tool", "tool_call_id": call.id, "content": "5"}]
        return api.chat.completions.create(model=endpoint.model, messages=messages, tools=TOOLS
                                           ).choices[0].message.content


class AskTwice(AgentLoop):
    """The docs' loop as it was written: its second turn at another temperature."""

    async def run(self, sample, engine):
        conv = self.conversation(sample)
        await conv.generate(engine)
        conv.add_messages([{"role": "user", "content": "Are you sure?"}])
        return conv.finish(answer=await conv.generate(engine, temperature=0.5))


LOOPS = {"streaming_calculator": StreamingCalculator, "async_stream": AsyncStream, "keep_alive": KeepAlive,
         "parts": Parts, "sampler": Sampler, "editor": Editor, "reformatted": ReformattedCalls, "ask_twice": AskTwice}


class Plugin:
    @hookimpl
    def rlforge_register(self, registry):
        for name, loop in LOOPS.items():
            registry.agent_loop.register(name, loop)


@pytest.fixture(scope="module")
def agent_pm():
    pm = PluginManager(autoload=False)
    pm.register(Plugin(), name="openai_protocol_agents")
    return pm


@pytest.fixture(autouse=True)
def clear_seen():
    SEEN.clear()


def test_a_streaming_agent_gets_the_same_trajectory(agent_pm, tok):
    batch = prompt_batch(tok, [("2+3?", "5")])
    ours, metrics = run_loop(agent_pm, tok, "streaming_calculator", Scripted(tok, calculator_then_answer))
    reference = runner_for(agent_pm, tok, "rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]")
    theirs, _ = reference.rollout(batch, sampling(), Scripted(tok, calculator_then_answer))
    reference.close()
    for col in (B.PROMPTS, B.RESPONSES, B.RESPONSE_MASK, B.ROLLOUT_LOG_PROBS):
        assert ours[col].tolist() == theirs[col].tolist(), col
    assert SEEN["stream"] == [("tool_calls", 82), ("stop", 2)]  # the tool call streamed, then the answer, with usage
    assert ours[B.SOLUTION_TEXT] == ["5"] and metrics["agent/tool_calls"] == 1 and metrics["agent/restarts/mean"] == 0


def test_an_async_client_streams_content_and_log_probs(agent_pm, tok):
    out, _ = run_loop(agent_pm, tok, "async_stream", Scripted(tok, lambda _: "42"))
    assert out[B.SOLUTION_TEXT] == ["42"] and SEEN["async_stream"] == [-0.5, -0.5, -0.5]  # "4", "2", EOS


def test_one_client_keeps_its_connection(agent_pm, tok):
    out, metrics = run_loop(agent_pm, tok, "keep_alive", Scripted(tok, lambda _: "5"))
    assert len(set(SEEN["ports"])) == 1 and len(SEEN["ports"]) == 3
    assert metrics["agent/model_turns/mean"] == 2 and metrics["agent/restarts/mean"] == 0


def test_content_as_text_parts_is_read(agent_pm, tok):
    out, metrics = run_loop(agent_pm, tok, "parts", Scripted(tok, lambda _: "5"))
    string, one_part, two_parts = SEEN["parts"]
    assert string == one_part and two_parts == string + 1  # the parts joined with a newline
    assert tok.decode(out[B.PROMPTS][0]) == "<|user|>2+\n3?<|end|><|assistant|>"


def test_the_rollouts_sampling_is_applied_and_any_other_is_refused(agent_pm, tok):
    engine = Scripted(tok, lambda _: "5")
    params = SamplingParams(n=1, temperature=0.7, top_p=0.9, max_new_tokens=160)
    out, _ = run_loop(agent_pm, tok, "sampler", engine, params=params)
    message, param = SEEN["sampler"]
    assert message == ("Unsupported request fields: temperature=0.5 (the rollout samples with temperature=0.7 "
                       "(rollout.temperature; rollout.val_* in validation) and the trainer scores every token at that "
                       "sampling, so tokens sampled otherwise would be trained off-policy; leave temperature out)")
    assert param == "temperature"
    # the one served request was generated with the rollout's sampling: its log-probs are the ones training uses
    assert [(p.temperature, p.top_p) for p in engine.params] == [(0.7, 0.9)]
    assert out[B.ROLLOUT_LOG_PROBS].tolist() == [[-0.5, -0.5]]


def test_a_native_loop_that_asks_for_another_temperature_fails_clearly(agent_pm, tok):
    with pytest.raises(AgentLoopError, match=r"'ask_twice'.*at turn 2: ValueError: generate\(\) asked for "
                                             r"temperature=0.5, but the rollout samples with temperature=0 .*"
                                             r"off-policy\. Leave temperature out"):
        run_loop(agent_pm, tok, "ask_twice", Scripted(tok, lambda _: "5"))


def test_an_edited_assistant_turn_restarts_the_trajectory_with_the_edit_in_the_prompt(agent_pm, tok):
    engine = Scripted(tok, lambda _: "5")
    out, metrics = run_loop(agent_pm, tok, "editor", engine)
    assert metrics["agent/edited_turns/mean"] == 1 and metrics["agent/restarts/mean"] == 1
    # the last conversation: its prompt holds the edited turn (never trained on), then two model turns
    assert tok.decode(out[B.PROMPTS][0]).endswith("<|assistant|>5 (edited)<|end|><|user|>sure?<|end|><|assistant|>")
    assert out[B.RESPONSE_MASK][0].tolist() == [1, 1] + [0] * 11 + [1, 1]  # "<|user|>and now?<|end|><|assistant|>"
    assert len(engine.params) == 3


def test_tool_calls_sent_back_reformatted_are_the_same_calls(agent_pm, tok):
    out, metrics = run_loop(agent_pm, tok, "reformatted", Scripted(tok, calculator_then_answer))
    assert metrics["agent/restarts/mean"] == 0 and metrics["agent/edited_turns/mean"] == 0
    assert out[B.SOLUTION_TEXT] == ["5"] and metrics["agent/model_turns/mean"] == 2


def test_fields_that_ask_for_what_the_endpoint_does_are_accepted():
    from rlforge.plugins.agent.openai_request import RequestError, parse_request

    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    defaults = {"n": 1, "stop": [], "tool_choice": "auto", "parallel_tool_calls": True,
                "response_format": {"type": "text"}, "presence_penalty": 0, "frequency_penalty": 0.0,
                "logit_bias": {}, "top_logprobs": 0, "store": False, "seed": None, "user": "u", "metadata": {"k": "v"},
                "model": "anything", "temperature": 1, "top_p": 1.0, "stream": True,
                "stream_options": {"include_usage": True}, "max_completion_tokens": 3, "logprobs": True}
    request = parse_request({"messages": messages, **defaults}, SamplingParams())
    assert request.messages == [{"role": "user", "content": "hi"}]
    assert (request.stream, request.include_usage, request.max_tokens, request.logprobs) == (True, True, 3, True)
    assert parse_request({"messages": messages, "tool_choice": "none"}, SamplingParams()).tools == []
    with pytest.raises(RequestError, match=r"tool_choice='none' \(only 'auto'"):
        parse_request({"messages": messages, "tool_choice": "none", "tools": TOOLS}, SamplingParams())
    with pytest.raises(RequestError, match=r"n=True \(only n=1"):
        parse_request({"messages": messages, "n": True}, SamplingParams())
    with pytest.raises(RequestError, match="stream_options is only valid with stream=true"):
        parse_request({"messages": messages, "stream_options": {"include_usage": True}}, SamplingParams())
