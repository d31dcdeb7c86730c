"""Replies to the model that are not a tool's own output: cut as every reply is."""

from __future__ import annotations

from rlforge.agent.chat import TRUNCATION_MARKER
from tests.agent.test_tools import Counter, Limits, run_calls


def test_the_replies_to_unreadable_and_extra_calls_are_cut_as_every_reply_is(tok):
    """helper-83: a parse error's reply quotes the call and ran to 210 tokens where the budget left 50: the model never
    saw it. max_tool_output_tokens cuts it, and the reply to a call past max_tool_calls_per_turn."""
    class Short(Limits):
        max_tool_calls_per_turn = 1
        max_tool_output_tokens = 24

    messages, _, _ = run_calls(tok, [Counter], ["counter", "counter"], ["not valid JSON: " + "x" * 400], limits=Short)
    for text in [m["content"] for m in messages[1:]]:
        assert text.startswith("Error: ") and text.endswith(TRUNCATION_MARKER), text
        assert len(tok.encode(text, add_special_tokens=False)) == 24
