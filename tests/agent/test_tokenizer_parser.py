"""The ``tokenizer`` tool parser: tool calls in the model's own format, read by transformers'
``tokenizer.parse_response`` with the ``response_template`` saved beside the tokenizer, in the tool loop and through
the OpenAI endpoint (real ``openai`` client)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import rlforge
from rlforge import batch as B
from rlforge.agent.chat import ChatFormat
from rlforge.build import Builder
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.models import CHAT_TEMPLATE, build_char_tokenizer
from rlforge.plugin_manager import PluginManager
from rlforge.plugins.agent.parsers import TokenizerParser
from tests.agent.conftest import Scripted, prompt_batch, runner_for, sampling
from tests.agent.test_openai import SyncAgent

# A model whose turns open with a prefilled <think>, and which calls tools as <call:NAME>{arguments}</call>
THINKING_TEMPLATE = CHAT_TEMPLATE.replace("<|assistant|>{% endif %}", "<|assistant|><think>{% endif %}")
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|assistant|>",
    "fields": {
        "thinking": {"open": "<think>", "close": "</think>"},
        "tool_calls": {"open_pattern": r"<call:(?P<name>\w+)>", "close": "</call>", "repeats": True,
                       "content": "json",
                       "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}}},
        "content": {"close": "<|end|>"},
    },
}
CALL = 'I add.</think>Let me compute. <call:calculator>{"expression": "2+3"}</call>'


@pytest.fixture(scope="module")
def own_tok(tmp_path_factory):
    """The char tokenizer with the thinking chat template and the response template, saved and loaded back."""
    tok = build_char_tokenizer()
    tok.chat_template = THINKING_TEMPLATE
    tok.response_template = RESPONSE_TEMPLATE
    folder = tmp_path_factory.mktemp("own-format-tokenizer")
    tok.save_pretrained(folder)
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(folder)
    loaded.padding_side = "left"
    return loaded


def bound(tokenizer, tools=()):
    """A tokenizer parser bound as a run binds it (the context's chat format and tool schemas)."""
    parser = TokenizerParser(None)
    parser.bind(SimpleNamespace(chat=ChatFormat(tokenizer), tools=SimpleNamespace(schemas=lambda: list(tools))))
    return parser


@pytest.fixture
def parser(own_tok):
    return bound(own_tok)


def test_the_saved_response_template_reads_calls_content_and_drops_the_reasoning(own_tok, parser):
    assert own_tok.response_template == RESPONSE_TEMPLATE  # kept in tokenizer_config.json
    turn = parser.parse(CALL)
    assert turn.content == "Let me compute." and not turn.errors
    assert [(c.name, c.arguments) for c in turn.calls] == [("calculator", {"expression": "2+3"})]
    assert turn.calls[0].id.startswith("call_")
    assert parser.parse("still thinking <call:f>{}</call>").calls == []  # inside the prefilled <think>
    answer = parser.parse("done</think>5")
    assert (answer.content, answer.calls, answer.errors) == ("5", [], [])


def test_unreadable_turns_and_calls_are_parse_errors(parser):
    bad_json = parser.parse("</think><call:calculator>{bad</call>")
    assert bad_json.calls == [] and len(bad_json.errors) == 1
    assert bad_json.errors[0].startswith("the turn does not follow the model's response_template (ValueError: json")
    mixed = parser.parse('</think><call:f>"text"</call><call:g>{"a": 1}</call><call:h>' + "[" * 80 + "]" * 80
                         + "</call>")
    assert [(c.name, c.arguments) for c in mixed.calls] == [("g", {"a": 1})]
    assert mixed.errors[0] == "the arguments of 'f' must be a JSON object, got 'text'"
    assert mixed.errors[1].startswith("the call is nested deeper than 64 levels")
    deep = parser.parse("</think><call:f>" + "[" * 100_000)  # past the JSON decoder's own recursion limit
    assert deep.calls == [] and "RecursionError" in deep.errors[0]


def test_arguments_written_as_text_are_cast_by_the_tools_schema():
    tok = build_char_tokenizer()
    tok.response_template = {**RESPONSE_TEMPLATE, "fields": {**RESPONSE_TEMPLATE["fields"], "tool_calls": {
        "open_pattern": r"<call:(?P<name>\w+)>", "close": "</call>", "repeats": True, "content": "xml-inline",
        "content_args": {"tag_pattern": r"<arg=(?P<key>\w+)>(?P<value>.*?)</arg>"},
        "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}}}}}
    add = {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "note": {"type": "string"}}}}}
    text = "<call:add><arg=a>7</arg><arg=note>7</arg></call>"  # the plain template: no prefilled <think>
    assert [c.arguments for c in bound(tok, [add]).parse(text).calls] == [{"a": 7, "note": "7"}]
    assert [c.arguments for c in bound(tok).parse(text).calls] == [{"a": "7", "note": "7"}]  # no schema: text


def test_a_tokenizer_without_a_response_template_is_a_config_error(pm, tok):
    cfg = rlforge.load_config(
        "grpo", ["rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]",
                 "rollout.agent.tool_parser=tokenizer"], plugins=pm)
    with pytest.raises(ConfigError, match="rollout.agent.tool_parser=tokenizer reads tool calls with the tokenizer's "
                                          "response_template"):
        Builder(cfg, pm).agent(tok)
    broken = build_char_tokenizer()
    broken.response_template = {"fields": {}}
    with pytest.raises(ConfigError, match="response_template is not valid: ValueError"):
        Builder(cfg, pm).agent(broken)


def calculator_in_own_format(prompt: str) -> str:
    """Turn 1 calls the calculator in the model's format; once the tool replied, answer with its result."""
    if "<|tool|>" not in prompt:
        return CALL
    return "Got it.</think>" + prompt.rsplit("<|tool|>", 1)[1].split("<|end|>", 1)[0]


def test_the_tool_loop_runs_calls_in_the_models_own_format(pm, own_tok):
    engine = Scripted(own_tok, calculator_in_own_format)
    runner = runner_for(pm, own_tok, "rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]",
                        "rollout.agent.tool_parser=tokenizer")
    try:
        out, metrics = runner.rollout(prompt_batch(own_tok, [("2+3?", "5")]), sampling(), engine)
    finally:
        runner.close()
    assert engine.waves[1][0].endswith("<|tool|>5<|end|><|assistant|><think>")  # the tool ran and replied "5"
    assert out[B.SOLUTION_TEXT] == ["Got it.</think>5"]
    assert metrics["tool_call_counts/mean"] == 1 and metrics["agent/parse_errors"] == 0


class Plugin:
    @hookimpl
    def rlforge_register(self, registry):
        registry.agent_loop.register("sync_agent", SyncAgent)


def test_the_openai_endpoint_returns_the_models_own_calls_as_tool_calls(own_tok):
    agent_pm = PluginManager(autoload=False)
    agent_pm.register(Plugin(), name="tokenizer_parser_agents")
    engine = Scripted(own_tok, calculator_in_own_format)
    runner = runner_for(agent_pm, own_tok, "rollout.agent.loop=sync_agent", "rollout.agent.tool_parser=tokenizer")
    try:
        out, metrics = runner.rollout(prompt_batch(own_tok, [("2+3?", "5")]), sampling(), engine)
    finally:
        runner.close()
    assert engine.waves[1][0].endswith("<|tool|>5<|end|><|assistant|><think>")  # the client ran the tool call
    # the agent's answer is the reply's content: the turn without its reasoning (sent as reasoning_content)
    assert out[B.SOLUTION_TEXT] == ["5"] and metrics["agent/restarts/mean"] == 0
