"""The hermes tool-call parser: well-formed calls, several calls, content around them, and every malformed case
(each becomes a parse error, never an exception)."""

from __future__ import annotations

import pytest

from rlforge.agent import ToolCall
from rlforge.plugins.agent.parsers import HermesParser, format_call

parser = HermesParser()


def test_one_call_and_its_content():
    turn = parser.parse('Let me compute. <tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n'
                        '</tool_call>')
    assert turn.content == "Let me compute."
    assert [(c.name, c.arguments) for c in turn.calls] == [("calculator", {"expression": "2*3"})]
    assert turn.errors == [] and turn.calls[0].id.startswith("call_")


def test_several_calls_get_distinct_ids():
    turn = parser.parse('<tool_call>{"name": "a", "arguments": {}}</tool_call>'
                        '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>')
    assert [c.name for c in turn.calls] == ["a", "b"] and turn.content == ""
    assert turn.calls[0].id != turn.calls[1].id


def test_plain_answer_has_no_calls():
    turn = parser.parse("The answer is 6.")
    assert turn.content == "The answer is 6." and turn.calls == [] and turn.errors == []


def test_arguments_as_a_json_string_and_missing_arguments():
    turn = parser.parse('<tool_call>{"name": "f", "arguments": "{\\"x\\": 2}"}</tool_call>'
                        '<tool_call>{"name": "g"}</tool_call>')
    assert [(c.name, c.arguments) for c in turn.calls] == [("f", {"x": 2}), ("g", {})]


@pytest.mark.parametrize("text, reason", [
    ("<tool_call>{not json}</tool_call>", "not valid JSON"),
    ('<tool_call>["calculator"]</tool_call>', "expected {\"name\""),
    ('<tool_call>{"arguments": {}}</tool_call>', "expected {\"name\""),
    ('<tool_call>{"name": "", "arguments": {}}</tool_call>', "expected {\"name\""),
    ('<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>', "must be a JSON object"),
    ('<tool_call>{"name": "f", "arguments": "oops"}</tool_call>', "must be a JSON object"),
    ('Sure. <tool_call>{"name": "f", "arguments": {}}', "has no </tool_call>"),
])
def test_malformed_calls_are_parse_errors(text, reason):
    turn = parser.parse(text)
    assert turn.calls == []
    assert len(turn.errors) == 1 and reason in turn.errors[0], turn.errors


def test_a_bad_call_next_to_a_good_one():
    turn = parser.parse('<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{bad</tool_call>')
    assert [c.name for c in turn.calls] == ["f"] and len(turn.errors) == 1


def test_format_call_round_trips():
    call = ToolCall("calculator", {"expression": "1+1"})
    assert [(c.name, c.arguments) for c in parser.parse(format_call(call)).calls] == [("calculator", {"expression": "1+1"})]


# --- adversarial model output: never an exception, always linear ---------------------------------------------


@pytest.mark.parametrize("body", [
    "[" * 100_000 + "]" * 100_000,  # past the C decoder's recursion limit
    '{"name": "f", "arguments": {"a": ' + "[" * 500 + "]" * 500 + "}}",  # decodes, but deeper than MAX_DEPTH
    '{"name": "f", "arguments": "' + '{\\"a\\": ' * 200 + "1" + "}" * 200 + '"}',  # the same, as a JSON string
    "[" * 100_000,  # never closed
])
def test_deeply_nested_json_is_a_parse_error(body):
    turn = parser.parse(f"<tool_call>{body}</tool_call>")
    assert turn.calls == [] and len(turn.errors) == 1
    assert "nested deeper than 64 levels" in turn.errors[0] or "not valid JSON" in turn.errors[0]


def test_nesting_up_to_the_limit_is_a_call():
    args = {"a": 1}
    for _ in range(62):
        args = {"a": args}
    turn = parser.parse(format_call(ToolCall("f", args)))
    assert [c.name for c in turn.calls] == ["f"] and turn.errors == []


def test_many_unclosed_tags_and_huge_calls_stay_linear():
    turn = parser.parse("<tool_call>x" * 200_000)  # quadratic for a regex that rescans after each tag
    assert turn.calls == [] and len(turn.errors) == 1 and turn.content == ""
    big = format_call(ToolCall("f", {"text": "y" * 5_000_000}))
    turn = parser.parse(big * 2 + "<tool_call>{bad</tool_call>" * 50_000)
    assert len(turn.calls) == 2 and len(turn.errors) == 50_000 and len(turn.errors[0]) < 400


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "\\ud800", "arguments": {"x": "\\udcff"}}</tool_call>',  # lone surrogates by JSON escape
    "<tool_call>{\"name\": \"f\ufffd\", \"arguments\": {}}</tool_call>",  # what decoding invalid UTF-8 gives
    "<tool_call>\x00\x01\x7f\u202e</tool_call>",
    "\udcff<tool_call>{}</tool_call>\ud800",
])
def test_invalid_unicode_never_raises(text):
    turn = parser.parse(text)
    assert len(turn.calls) + len(turn.errors) == 1
    for reason in turn.errors:
        reason.encode("utf-8")  # error replies are always encodable (repr escapes surrogates)
