"""The OpenAI endpoint's ``reasoning_content`` (what the tool parser reads as reasoning: Qwen3's
``<think>...</think>``) and its token-by-token streaming, with the real ``openai`` client."""

from __future__ import annotations

import pytest

from rlforge import batch as B
from rlforge.hookspecs import hookimpl
from rlforge.plugin_manager import PluginManager
from rlforge.plugins.agent.openai_recorder import token_texts
from rlforge.plugins.agent.openai_server import OpenAIAgentLoop
from rlforge.plugins.agent.parsers import HermesParser, split_reasoning
from rlforge.plugins.agent.tools import Calculator
from tests.agent.conftest import CALL, LOGPROB, Scripted, run_loop

SEEN: dict = {}
TOOLS = [Calculator(None).schema()]


def client(endpoint):
    import openai

    return openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)


class Plain(OpenAIAgentLoop):
    def agent(self, sample, endpoint):
        message = client(endpoint).chat.completions.create(model=endpoint.model, messages=sample.messages,
                                                           tools=TOOLS).choices[0].message
        SEEN["plain"] = (message.content, message.reasoning_content, message.tool_calls)
        return message.content


class Streamed(OpenAIAgentLoop):
    def agent(self, sample, endpoint):
        stream = client(endpoint).chat.completions.create(model=endpoint.model, messages=sample.messages,
                                                          stream=True, logprobs=True)
        SEEN["chunks"] = [(c.choices[0].delta.model_dump(exclude_none=True),
                           [e.logprob for e in (c.choices[0].logprobs.content if c.choices[0].logprobs else [])])
                          for c in stream]
        return None


class Plugin:
    @hookimpl
    def rlforge_register(self, registry):
        registry.agent_loop.register("plain", Plain)
        registry.agent_loop.register("streamed", Streamed)


@pytest.fixture(scope="module")
def agent_pm():
    pm = PluginManager(autoload=False)
    pm.register(Plugin(), name="reasoning_agents")
    return pm


@pytest.mark.parametrize(("text", "expected"), [
    ("<think>plan</think>5", ("plan", "5")),
    ("plan</think>5", ("plan", "5")),  # the chat template prefilled <think>
    ("5", ("", "5")),
    ("<think>unfinished", ("", "<think>unfinished")),  # no </think>: no reasoning
])
def test_split_reasoning(text, expected):
    assert split_reasoning(text) == expected


def test_hermes_reads_calls_after_the_reasoning_only():
    turn = HermesParser().parse(f"<think>maybe {CALL}?</think>{CALL}")
    assert turn.reasoning == f"maybe {CALL}?" and len(turn.calls) == 1 and turn.content == ""
    assert HermesParser().parse(CALL).reasoning == ""


def test_a_reply_carries_the_reasoning_apart_from_the_content(agent_pm, tok):
    out, _ = run_loop(agent_pm, tok, "plain", Scripted(tok, lambda _: "<think>2 plus 3</think>5"))
    assert SEEN["plain"] == ("5", "2 plus 3", None)
    assert tok.decode(out[B.RESPONSES][0]) == "<think>2 plus 3</think>5<|end|>"  # trained as generated
    run_loop(agent_pm, tok, "plain", Scripted(tok, lambda _: f"<think>use the tool</think>{CALL}"))
    content, reasoning, calls = SEEN["plain"]
    assert (content, reasoning, calls[0].function.name) == (None, "use the tool", "calculator")


def test_streaming_sends_one_chunk_per_token_with_its_log_prob(agent_pm, tok):
    run_loop(agent_pm, tok, "streamed", Scripted(tok, lambda _: "42"))
    assert SEEN["chunks"] == [({"role": "assistant", "content": ""}, []), ({"content": "4"}, [LOGPROB]),
                              ({"content": "2"}, [LOGPROB]), ({}, [LOGPROB])]  # the end token's with the finish


def test_streamed_reasoning_comes_token_by_token_without_its_markers(agent_pm, tok):
    run_loop(agent_pm, tok, "streamed", Scripted(tok, lambda _: "<think>ab</think>12"))
    deltas = [d for d, _ in SEEN["chunks"][1:-1]]
    assert deltas == [{"reasoning_content": "a"}, {"reasoning_content": "b"}, {"content": "1"}, {"content": "2"}]
    assert [len(lp) for _, lp in SEEN["chunks"]] == [0, 8, 1, 9, 1, 1]  # each marker token with the next chunk
    assert sum(len(lp) for _, lp in SEEN["chunks"]) == len("<think>ab</think>12") + 1  # every token, once


class ByteChat:
    """A byte-level decoder: a token is one byte; a cut UTF-8 sequence decodes to U+FFFD."""

    @staticmethod
    def decode(ids):
        return bytes(ids).decode("utf-8", "replace")


def test_a_token_inside_a_character_adds_nothing_until_the_character_is_whole():
    ids = list("aé€!".encode())
    pieces = token_texts(ByteChat(), ids)
    assert pieces == ["a", "", "é", "", "", "€", "!"] and "".join(pieces) == "aé€!"
