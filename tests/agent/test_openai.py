"""The OpenAI-compatible endpoint with the real ``openai`` client: an agent written against the client (tool calls
included) produces the same trajectory, token for token, as the built-in ``tool_agent`` loop."""

from __future__ import annotations

import http.client
import json
import textwrap
import threading
import urllib.parse

import openai
import pytest

import rlforge
from rlforge import batch as B
from rlforge.agent import AgentLoopError
from rlforge.hookspecs import hookimpl
from rlforge.plugin_manager import PluginManager
from rlforge.plugins.agent.openai_server import OpenAIAgentLoop
from rlforge.plugins.agent.tools import Calculator
from tests.agent.conftest import (LOGPROB, Scripted, calculator_then_answer, prompt_batch, run_loop, runner_for,
                                  sampling)

TOOLS = [Calculator(None).schema()]


def client(endpoint):
    return openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)


def calculator_agent(sample, endpoint):
    """A plain OpenAI-client agent: call tools until the model answers."""
    api = client(endpoint)
    messages = list(sample.messages)
    for _ in range(4):
        reply = api.chat.completions.create(model=endpoint.model, messages=messages, tools=TOOLS, temperature=0,
                                            logprobs=True)
        message = reply.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            return message.content
        for call in message.tool_calls:
            result = Calculator(None).execute(json.loads(call.function.arguments), None)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None


class SyncAgent(OpenAIAgentLoop):
    def agent(self, sample, endpoint):
        return calculator_agent(sample, endpoint)


class LongTool(OpenAIAgentLoop):
    """Answers the model's tool call with 5,000 characters, as a search tool may."""

    def agent(self, sample, endpoint):
        api = client(endpoint)
        messages = list(sample.messages)
        call = api.chat.completions.create(model=endpoint.model, messages=messages, tools=TOOLS).choices[0].message
        messages += [call, {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "1" * 5000}]
        return api.chat.completions.create(model=endpoint.model, messages=messages, tools=TOOLS).choices[0].message.content


class AsyncAgent(OpenAIAgentLoop):
    async def agent(self, sample, endpoint):
        api = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
        reply = await api.chat.completions.create(model=endpoint.model, messages=sample.messages)
        return {"answer": reply.choices[0].message.content, "reward": 0.5, "metrics": {"requests": 1}}


class Probe(OpenAIAgentLoop):
    """Records what the endpoint answers to edge cases."""

    seen: list = []

    def agent(self, sample, endpoint):
        api = client(endpoint)
        for kwargs in ({"n": 2}, {"stop": ["\n"]}, {"tool_choice": "required", "seed": 3},
                       {"response_format": {"type": "json_object"}, "extra_body": {"top_k": 5, "guided_json": {}}}):
            try:
                api.chat.completions.create(model="m", messages=sample.messages, **kwargs)
            except openai.BadRequestError as exc:
                Probe.seen.append(exc.body["message"])
        first = api.chat.completions.create(model="m", messages=sample.messages)
        other = api.chat.completions.create(model="m", messages=[{"role": "user", "content": "1+1?"}])  # not a reply
        Probe.seen.append((first.choices[0].finish_reason, other.choices[0].message.content))
        return other.choices[0].message.content


BAD_SAMPLING = ({"temperature": -1}, {"top_p": 5}, {"top_p": 0}, {"max_tokens": -1}, {"max_tokens": 0},
                {"max_completion_tokens": 1.5})


class BadSampling(OpenAIAgentLoop):
    """The agent of "bad?" tries out-of-range sampling values, then sends a good request; the others send one."""

    seen: list = []

    def agent(self, sample, endpoint):
        api = client(endpoint)
        if sample.messages[0]["content"] == "bad?":
            for kwargs in BAD_SAMPLING:
                try:
                    api.chat.completions.create(model="m", messages=sample.messages, **kwargs)
                except openai.BadRequestError as exc:
                    BadSampling.seen.append(exc.body["message"])
        return api.chat.completions.create(model="m", messages=sample.messages).choices[0].message.content


class Rejected(OpenAIAgentLoop):
    """A good request, then requests rejected with 400 on the same conversation; the first reply is the answer."""

    seen: list = []

    def agent(self, sample, endpoint):
        api = client(endpoint)
        first = api.chat.completions.create(model="m", messages=sample.messages).choices[0].message
        more = [*sample.messages, first, {"role": "user", "content": "sure?"}]
        long = [{"role": "user", "content": "x" * 100}]  # over data.max_prompt_length=64
        for messages, kwargs in ((more, {"max_tokens": -1}), (more, {"seed": 1}), (more, {"n": 2}),
                                 (more, {"stop": ["\n"]}), (sample.messages, {"temperature": -1}), (long, {})):
            try:
                api.chat.completions.create(model="m", messages=messages, **kwargs)
            except openai.BadRequestError as exc:
                Rejected.seen.append(exc.body["message"][:20])
        return first.content


CONCURRENT = 96


class Crowd(OpenAIAgentLoop):
    """All agents send their request at once, on fresh connections, without retries (plain http.client: an
    openai client per agent costs ~80 ms of CPU to build)."""

    barrier = threading.Barrier(CONCURRENT, timeout=30)

    def agent(self, sample, endpoint):
        url = urllib.parse.urlsplit(endpoint.base_url)
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        Crowd.barrier.wait()
        connection.request("POST", f"{url.path}/chat/completions", json.dumps({"messages": sample.messages}),
                           {"Content-Type": "application/json"})
        reply = json.loads(connection.getresponse().read())
        connection.close()
        return reply["choices"][0]["message"]["content"]


class Models(OpenAIAgentLoop):
    seen: list = []

    def agent(self, sample, endpoint):
        api = client(endpoint)
        Models.seen += [[m.id for m in api.models.list()], api.models.retrieve(endpoint.model).id]
        return api.chat.completions.create(model=endpoint.model, messages=sample.messages).choices[0].message.content


class BigAndSmall(OpenAIAgentLoop):
    """The agent of "big?" sends a 300 kB request (over data.max_prompt_length: a 400 once tokenized); the other one
    sends its small request while the big one is being read (``big_started``), and says when it got its answer."""

    big_started = threading.Event()
    small_done = threading.Event()
    seen: list = []

    def agent(self, sample, endpoint):
        api = client(endpoint)
        if sample.messages[0]["content"] != "big?":
            BigAndSmall.big_started.wait(30)
            answer = api.chat.completions.create(model="m", messages=sample.messages).choices[0].message.content
            BigAndSmall.small_done.set()
            return answer
        try:
            api.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 300_000}])
        except openai.BadRequestError as exc:
            BigAndSmall.seen.append(exc.body["message"])
        return api.chat.completions.create(model="m", messages=sample.messages).choices[0].message.content

    @staticmethod
    def stalled(fn, big):
        """``fn``, which on the big request (``big(*args)``) waits until the small request got its answer (at most
        10 s: on the event loop it never would) and records whether it did."""
        def wrapper(*args, **kwargs):
            if big(*args):
                BigAndSmall.big_started.set()
                BigAndSmall.seen.append(("small answered meanwhile", BigAndSmall.small_done.wait(10)))
            return fn(*args, **kwargs)
        return wrapper


class Strict(Scripted):
    """Fails the whole wave on an out-of-range sampling value, as an inference engine does."""

    def __call__(self, prompts, params):
        if any(p.temperature < 0 or not 0 < p.top_p <= 1 or p.max_new_tokens < 1 for p in params):
            raise ValueError("invalid sampling parameters")
        return super().__call__(prompts, params)


class Plugin:
    @hookimpl
    def rlforge_register(self, registry):
        registry.agent_loop.register("sync_agent", SyncAgent)
        registry.agent_loop.register("async_agent", AsyncAgent)
        registry.agent_loop.register("probe", Probe)
        registry.agent_loop.register("bad_sampling", BadSampling)
        registry.agent_loop.register("rejected", Rejected)
        registry.agent_loop.register("crowd", Crowd)
        registry.agent_loop.register("models", Models)
        registry.agent_loop.register("long_tool", LongTool)
        registry.agent_loop.register("big_and_small", BigAndSmall)


@pytest.fixture(scope="module")
def agent_pm():
    pm = PluginManager(autoload=False)
    pm.register(Plugin(), name="openai_test_agents")
    return pm


def test_openai_client_agent_matches_the_tool_agent_loop(agent_pm, tok):
    batch = prompt_batch(tok, [("2+3?", "5"), ("2+3?", "5")])
    runner = runner_for(agent_pm, tok, "rollout.agent.loop=sync_agent")
    try:
        ours, metrics = runner.rollout(batch, sampling(), Scripted(tok, calculator_then_answer))
    finally:
        runner.close()
    reference = runner_for(agent_pm, tok, "rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]")
    theirs, reference_metrics = reference.rollout(batch, sampling(), Scripted(tok, calculator_then_answer))
    for col in (B.PROMPTS, B.RESPONSES, B.RESPONSE_MASK, B.ATTENTION_MASK, B.ROLLOUT_LOG_PROBS):
        assert ours[col].tolist() == theirs[col].tolist(), col
    assert ours[B.RESPONSE_MASK][0].tolist() == [1] * 82 + [0] * 11 + [1] * 2  # as in test_masks
    assert ours[B.SOLUTION_TEXT] == ["5", "5"]  # the agent's return value
    assert metrics["agent/restarts/mean"] == 0 and metrics["agent/model_turns/mean"] == 2
    for key in ("tool_call_counts/mean", "agent/tool_calls", "agent/parse_errors", "agent/tool_call_format_ok"):
        assert metrics[key] == reference_metrics[key], key  # the tool calls the endpoint parsed
    assert metrics["agent/tool_calls"] == 2 and metrics["agent/tool_call_format_ok"] == 1


def test_a_long_tool_message_is_cut_as_tool_agent_cuts_a_tool_s_reply(agent_pm, tok):
    """rollout.agent.max_tool_output_tokens holds for the tool messages an agent sends (helper-52: 300 characters
    took the whole response budget, the model never saw the tool's reply)."""
    runner = runner_for(agent_pm, tok, "rollout.agent.loop=long_tool", "rollout.agent.max_tool_output_tokens=24")
    try:
        out, _ = runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(), Scripted(tok, calculator_then_answer))
    finally:
        runner.close()
    answer = out[B.SOLUTION_TEXT][0]  # the model (scripted) repeats the tool's reply as it saw it
    assert answer.startswith("1" * 5) and answer.endswith("...(truncated)") and len(tok.encode(answer)) <= 24


def test_unreadable_tool_calls_count_as_parse_errors(agent_pm, tok):
    _, metrics = run_loop(agent_pm, tok, "sync_agent", Scripted(tok, lambda _: "<tool_call>{oops</tool_call>"))
    assert metrics["agent/parse_errors"] == 1 and metrics["agent/tool_calls"] == 0
    assert metrics["agent/tool_call_format_ok"] == 0


def test_async_agent_entry_reward_and_metrics(agent_pm, tok):
    out, metrics = run_loop(agent_pm, tok, "async_agent", Scripted(tok, lambda _: "5"), n=2)
    assert out[B.RESPONSE_MASK].tolist() == [[1, 1]] * 2 and out[B.ROLLOUT_LOG_PROBS].tolist() == [[LOGPROB] * 2] * 2
    assert out["agent_rewards"][:, 1].tolist() == [0.5, 0.5] and metrics["agent/requests/mean"] == 1


def test_entry_function_from_a_file(pm, tok, tmp_path):
    agent_file = tmp_path / "my_agent.py"
    agent_file.write_text(textwrap.dedent("""
        import openai

        def agent(sample, endpoint):
            api = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
            reply = api.chat.completions.create(model=endpoint.model, messages=sample.messages, max_tokens=1)
            assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 1
            return None
    """))
    runner = runner_for(pm, tok, "rollout.agent.loop=openai_agent",
                        f"rollout.agent.openai_agent.entry={agent_file}:agent")
    try:
        out, _ = runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(), Scripted(tok, lambda _: "42"))
    finally:
        runner.close()
    assert tok.decode(out[B.RESPONSES][0]) == "4" and out[B.SOLUTION_TEXT] == ["4"]


def test_an_entry_file_is_one_module_per_process(tmp_path):
    """Trajectories that start together load the file once: its module-level state (a client, a cache) is shared,
    as an import shares it (helper-52: four copies, one per agent thread)."""
    import sys

    from omegaconf import OmegaConf

    from rlforge.plugins.agent.openai_server import OpenAIAgentLoop

    (tmp_path / "counted.py").write_text("import time\ntime.sleep(0.2)\nLOADS = []\ndef agent(s, e):\n"
                                         "    LOADS.append(1)\n    return len(LOADS)\n")
    loop = OpenAIAgentLoop.__new__(OpenAIAgentLoop)
    loop._fn, loop.config = None, OmegaConf.create({"rollout": {"agent": {"openai_agent": {
        "entry": f"{tmp_path / 'counted.py'}:agent"}}}})
    calls = [threading.Thread(target=loop.agent, args=(None, None)) for _ in range(4)]
    for t in calls:
        t.start()
    for t in calls:
        t.join()
    assert sys.modules["rlforge_openai_agent_counted"].LOADS == [1, 1, 1, 1]


def test_unsupported_requests_are_400s_and_a_new_conversation_restarts(agent_pm, tok):
    Probe.seen.clear()
    out, metrics = run_loop(agent_pm, tok, "probe", Scripted(tok, lambda _: "7"))
    assert Probe.seen[:4] == [
        "Unsupported request fields: n=2 (only n=1: send one request per completion)",
        "Unsupported request fields: stop=['\\n'] (no stop sequences: the model stops at its end-of-turn token)",
        "Unsupported request fields: tool_choice='required' (only 'auto': the model decides whether to call a tool "
        "(a call cannot be forced or forbidden without changing what it samples)); seed=3 (the rollout seeds its own "
        "sampling (trainer.seed))",
        "Unsupported request fields: response_format={'type': 'json_object'} (only {'type': 'text'}: there is no "
        "constrained decoding); top_k (not supported by the rlforge endpoint); guided_json (not supported by the "
        "rlforge endpoint)"]
    assert Probe.seen[4] == ("stop", "7")
    assert metrics["agent/restarts/mean"] == 1
    assert tok.decode(out[B.PROMPTS][0]) == "<|user|>1+1?<|end|><|assistant|>"  # the last conversation


def test_openai_agent_needs_an_entry(pm):
    with pytest.raises(rlforge.errors.ConfigError, match="rollout.agent.openai_agent.entry"):
        rlforge.load_config("grpo", ["rollout.agent.loop=openai_agent"], plugins=pm)


def test_an_agent_that_never_calls_the_endpoint_fails_the_run(pm, tok, tmp_path):
    (tmp_path / "lazy.py").write_text("def agent(sample, endpoint):\n    return 'done'\n")
    runner = runner_for(pm, tok, "rollout.agent.loop=openai_agent",
                        f"rollout.agent.openai_agent.entry={tmp_path / 'lazy.py'}:agent")
    try:
        with pytest.raises(AgentLoopError, match="'openai_agent'.*without sending a chat-completions request"):
            runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(), Scripted(tok, lambda _: "5"))
    finally:
        runner.close()


def test_out_of_range_sampling_values_are_the_requests_own_400s(agent_pm, tok):
    BadSampling.seen.clear()
    engine = Strict(tok, lambda _: "5")
    out, _ = run_loop(agent_pm, tok, "bad_sampling", engine, [("bad?", "5"), ("2+3?", "5"), ("2+3?", "5")])
    assert BadSampling.seen == [
        "Unsupported request fields: temperature=-1 (out of range: temperature must be a number >= 0)",
        "Unsupported request fields: top_p=5 (out of range: top_p must be a number with 0 < top_p <= 1)",
        "Unsupported request fields: top_p=0 (out of range: top_p must be a number with 0 < top_p <= 1)",
        "max_tokens=-1 is out of range: max_tokens must be an integer >= 1",
        "max_tokens=0 is out of range: max_tokens must be an integer >= 1",
        "max_completion_tokens=1.5 is out of range: max_completion_tokens must be an integer >= 1"]
    assert len(engine.params) == 3  # the good requests only: no bad value reached the engine
    assert out[B.RESPONSE_MASK].tolist() == [[1, 1]] * 3 and out[B.SOLUTION_TEXT] == ["5", "5", "5"]


def test_a_rejected_request_changes_nothing(agent_pm, tok):
    Rejected.seen.clear()
    engine = Scripted(tok, lambda _: "5")
    out, metrics = run_loop(agent_pm, tok, "rejected", engine)
    assert len(Rejected.seen) == 6 and len(engine.params) == 1
    assert out[B.RESPONSE_MASK].tolist() == [[1, 1]] and out[B.ROLLOUT_LOG_PROBS].tolist() == [[LOGPROB] * 2]
    assert tok.decode(out[B.PROMPTS][0]).endswith("<|user|>2+3?<|end|><|assistant|>")
    assert metrics["agent/restarts/mean"] == 0 and out[B.SOLUTION_TEXT] == ["5"]


def test_many_concurrent_agents_without_retries(agent_pm, tok):
    Crowd.barrier.reset()
    out, _ = run_loop(agent_pm, tok, "crowd", Scripted(tok, lambda _: "5"), n=CONCURRENT)
    assert out[B.SOLUTION_TEXT] == ["5"] * CONCURRENT


def test_the_model_list(agent_pm, tok):
    Models.seen.clear()
    out, _ = run_loop(agent_pm, tok, "models", Scripted(tok, lambda _: "5"))
    assert Models.seen == [["rlforge-policy"], "rlforge-policy"] and out[B.SOLUTION_TEXT] == ["5"]


def test_an_agent_whose_requests_were_all_rejected_fails_the_run_saying_why(pm, tok, tmp_path):
    (tmp_path / "rejected.py").write_text(textwrap.dedent("""
        import openai

        def agent(sample, endpoint):
            api = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
            for _ in range(2):
                try:
                    api.chat.completions.create(model=endpoint.model, messages=sample.messages, max_tokens=-1)
                except openai.BadRequestError:
                    pass
            return "done"
    """))
    runner = runner_for(pm, tok, "rollout.agent.loop=openai_agent",
                        f"rollout.agent.openai_agent.entry={tmp_path / 'rejected.py'}:agent")
    try:
        with pytest.raises(AgentLoopError, match=r"without a successful chat-completions request \(2 rejected: "
                                                 r"max_tokens=-1 is out of range"):
            runner.rollout(prompt_batch(tok, [("2+3?", "5")]), sampling(), Scripted(tok, lambda _: "5"))
    finally:
        runner.close()


@pytest.mark.parametrize("stage", ["parse", "tokenize"])
def test_a_big_request_does_not_hold_up_the_others(agent_pm, tok, monkeypatch, stage):
    """A 300 kB body was JSON-decoded, checked and tokenized on the endpoint's event loop: every other agent's request
    waited meanwhile (adversarial review). Now a large one is read on a worker thread and a small one is answered
    while it is."""
    from rlforge.agent.chat import ChatFormat
    from rlforge.plugins.agent import openai_recorder

    def big_body(body, *_):
        return len(json.dumps(body)) > 100_000

    def big_prompt(chat, messages, *_):
        return sum(len(m.get("content") or "") for m in messages) > 100_000

    if stage == "parse":
        monkeypatch.setattr(openai_recorder, "parse_request", BigAndSmall.stalled(openai_recorder.parse_request,
                                                                                   big_body))
    else:
        monkeypatch.setattr(ChatFormat, "prompt_ids", BigAndSmall.stalled(ChatFormat.prompt_ids, big_prompt))
    BigAndSmall.seen.clear()
    BigAndSmall.big_started.clear()
    BigAndSmall.small_done.clear()
    out, _ = run_loop(agent_pm, tok, "big_and_small", Scripted(tok, lambda _: "5"), [("big?", "5"), ("2+3?", "5")])
    assert BigAndSmall.seen[0] == ("small answered meanwhile", True)
    assert BigAndSmall.seen[1].startswith("the prompt is 300") and "over data.max_prompt_length=64" in \
        BigAndSmall.seen[1]  # the big request itself is served as before: here, refused once tokenized
    assert out[B.SOLUTION_TEXT] == ["5", "5"]
