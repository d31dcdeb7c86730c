"""Tools: the calculator's arithmetic and refusals, the python tool in the sandbox, and the toolbox's handling of
tools that raise, hang, block the event loop, exit, fork, return junk, do not exist or say too much (an error reply,
counted; never a crash, a stalled rollout or a process that cannot exit)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time

import pytest

from rlforge.agent import ParsedTurn, Sample, Tool, ToolCall, ToolResult
from rlforge.agent.chat import TRUNCATION_MARKER, ChatFormat
from rlforge.agent.toolbox import Toolbox
from rlforge.agent.types import ToolStats
from rlforge.errors import RLForgeError
from rlforge.plugins.agent.tools import Calculator, CalculatorConfig, PythonTool

SAMPLE = Sample([], [1], "arith", "5", None, "u", 0)


def calc(expression, **limits):
    tool = Calculator(None)
    tool.__dict__["options"] = CalculatorConfig(**limits)
    return tool.execute({"expression": expression}, None)


@pytest.mark.parametrize("expression, value", [
    ("1 + 2 * 3", "7"), ("(1 + 2) * 3", "9"), ("7 // 2", "3"), ("7 % 3", "1"), ("-7 // 2", "-4"), ("8 / 2", "4"),
    ("1 / 4", "0.25"), ("0.1 + 0.2", "0.3"), ("2 ** 10", "1024"), ("-2 ** 2", "-4"), ("(-2) ** 2", "4"),
    ("2 ** -1", "0.5"), ("--3", "3"), ("+3", "3"), ("1.5 * 2", "3"), ("10 - 2 - 3", "5"),
])
def test_calculator_results(expression, value):
    assert calc(expression) == value


@pytest.mark.parametrize("expression, reason", [
    ("x + 1", "names are not allowed"),
    ("__import__('os')", "function calls are not allowed"),
    ("abs(-1)", "function calls are not allowed"),
    ("(1).real", "attributes are not allowed"),
    ("[1][0]", "subscripts are not allowed"),
    ("[1, 2]", "List is not allowed"),
    ("'a' * 3", "the constant 'a' is not allowed"),
    ("True + 1", "the constant True is not allowed"),
    ("1j * 2", "the constant 1j is not allowed"),
    ("1 << 3", "operator LShift is not allowed"),
    ("not 1", "operator Not is not allowed"),
    ("1 if 1 else 2", "IfExp is not allowed"),
    ("2 ** 100", "exponents are limited to 64"),
    ("9 ** 9 ** 9", "exponents are limited to 64"),
    ("99 ** 60", "more than 100 digits"),
    ("10 ** 60 * 10 ** 60", "more than 100 digits"),
    ("1e300 * 1e300", "too large"),
    ("(-8) ** 0.5", "not a real number"),
    ("1 / 0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("1 +", "not an arithmetic expression"),
    ("1" * 201, "over 200"),
])
def test_calculator_refusals(expression, reason):
    from rlforge.agent import ToolError

    with pytest.raises(ToolError, match=reason):
        calc(expression)


def test_calculator_limits_come_from_its_options():
    assert calc("2 ** 8", max_exponent=8) == "256"
    with pytest.raises(Exception, match="limited to 7"):
        calc("2 ** 8", max_exponent=7)


def test_python_tool_runs_in_the_sandbox(make_config):
    tool = PythonTool(make_config("rollout.agent.tools=[python]"))
    assert tool.execute({"code": "print(6 * 7)"}, None).strip() == "42"
    failed = tool.execute({"code": "raise ValueError('boom')"}, None)
    assert "ValueError: boom" in failed and "[exit code 1]" in failed


# --- the toolbox: bad tools ------------------------------------------------------------------------


class Raises(Tool):
    name = "raises"

    def execute(self, arguments, state):
        raise KeyError("no such key")


class Exits(Tool):
    name = "exits"

    def execute(self, arguments, state):
        raise SystemExit(3)


class Hangs(Tool):
    name = "hangs"

    async def execute(self, arguments, state):
        await asyncio.sleep(60)


class HangsSync(Tool):
    name = "hangs_sync"

    def execute(self, arguments, state):
        time.sleep(1.0)
        return "late"


class ExitsAsync(Tool):
    name = "exits_async"

    async def execute(self, arguments, state):
        sys.exit(4)


class Junk(Tool):
    name = "junk"

    def execute(self, arguments, state):
        return {"not": "text"}


class Opaque(Tool):
    name = "opaque"

    def execute(self, arguments, state):
        return object()  # its repr has a memory address, which must not reach the reply (it is trained on)


class BadReward(Tool):
    name = "bad_reward"

    def execute(self, arguments, state):
        return ToolResult("ok", float("nan"))


class Chatty(Tool):
    name = "chatty"

    def execute(self, arguments, state):
        return "x" * 1000


class Counter(Tool):
    """Per-trajectory state: create/release, a reward per call."""

    name = "counter"
    released: list[int] = []

    def create(self, sample):
        return {"calls": 0}

    async def execute(self, arguments, state):
        state["calls"] += 1
        return ToolResult(f"call {state['calls']}", reward=0.25)

    def release(self, state):
        Counter.released.append(state["calls"])


class Limits:
    max_tool_calls_per_turn = 3
    tool_timeout_s = 0.3
    max_tool_output_tokens = 100
    tool_output_truncate_side = "right"


def run_calls(tok, tools, calls, errors=(), limits=Limits):
    box = Toolbox({t.name: t(None) for t in tools}, limits())
    stats = ToolStats()

    async def go():
        async with box.session(SAMPLE, ChatFormat(tok), stats) as session:
            return await session.run(ParsedTurn("", [ToolCall(n, {}, f"id{i}") for i, n in enumerate(calls)],
                                                list(errors)))

    try:
        messages, reward = asyncio.run(go())
    finally:
        box.close()
    return messages, reward, stats


@pytest.mark.parametrize("tool, reply", [
    (Raises, "Error: the tool 'raises' failed: KeyError: 'no such key'"),
    (Exits, "Error: the tool 'exits' failed: RuntimeError: sys.exit(3) called"),  # ends the call, not the run
    (ExitsAsync, "Error: the tool 'exits_async' failed: RuntimeError: sys.exit(4) called"),
    (Hangs, "Error: the tool 'hangs' did not answer within 0.3 s (rollout.agent.tool_timeout_s)"),
    (HangsSync, "Error: the tool 'hangs_sync' did not answer within 0.3 s"),
    (Junk, "Error: the tool 'junk' returned dict"),
    (Opaque, "Error: the tool 'opaque' returned object (<object object>), not text"),
    (BadReward, "Error: the tool 'bad_reward' returned the reward nan, not a finite number"),
])
def test_a_failing_tool_gives_an_error_reply(tok, tool, reply, caplog, monkeypatch):
    from rlforge.agent import toolbox

    monkeypatch.setattr(toolbox, "_FAILED", set())
    with caplog.at_level("WARNING", logger="rlforge.agent"):
        messages, reward, stats = run_calls(tok, [tool], [tool.name])
        run_calls(tok, [tool], [tool.name])
    assert messages[0]["role"] == "tool" and messages[0]["tool_call_id"] == "id0"
    assert messages[0]["content"].startswith(reply), messages[0]["content"]
    assert (stats.calls, stats.errors, reward) == (1, 1, 0.0)
    logged = [r.getMessage() for r in caplog.records if r.name == "rlforge.agent" and "failed (sample" in r.getMessage()]
    assert len(logged) == 1 and reply.removeprefix("Error: ")[:24] in logged[0]  # its author sees it, once


def test_unknown_tool_and_too_many_calls_and_parse_errors(tok):
    messages, _, stats = run_calls(tok, [Counter], ["nope", "counter", "counter", "counter"], ["not valid JSON"])
    texts = [m["content"] for m in messages]
    assert texts[0] == "Error: there is no tool 'nope'. Available tools: counter"
    assert texts[1:3] == ["call 1", "call 2"]
    assert texts[3].startswith("Error: only 3 tool calls per turn are run")
    assert texts[4] == "Error: the tool call could not be read: not valid JSON"
    assert (stats.calls, stats.errors, stats.parse_errors) == (3, 2, 1)


def test_tool_state_reward_and_release(tok):
    Counter.released.clear()
    messages, reward, stats = run_calls(tok, [Counter], ["counter", "counter"])
    assert sorted(m["content"] for m in messages) == ["call 1", "call 2"]
    assert reward == 0.5 and Counter.released == [2] and len(stats.seconds) == 2


def test_long_tool_output_is_truncated_with_a_marker(tok):
    messages, _, stats = run_calls(tok, [Chatty], ["chatty"])
    text = messages[0]["content"]
    assert text.endswith(TRUNCATION_MARKER) and len(tok.encode(text, add_special_tokens=False)) == 100
    assert stats.errors == 0


def test_schema_name_must_be_the_registered_name():
    with pytest.raises(RLForgeError, match="declares the function name 'calculator'"):
        Toolbox({"calc": Calculator(None)}, Limits())


def test_schema_parameters_must_be_a_json_schema_object():
    class Listed(Calculator):
        def schema(self):
            schema = super().schema()
            return {**schema, "function": {**schema["function"], "parameters": ["expression"]}}

    with pytest.raises(RLForgeError, match=r"Tool 'calculator' \(rollout.agent.tools\) declares 'parameters' of type "
                                           r"list in its schema: it must be a JSON-schema object"):
        Toolbox({"calculator": Listed(None)}, Limits())


class Duck:
    """A tool that only has what the Tool Protocol asks for (no base class, no create/release)."""

    name = "duck"

    def schema(self):
        return {"type": "function", "function": {"name": "duck", "description": "", "parameters": {}}}

    def execute(self, arguments, state):
        return f"quack {state}"


def test_a_duck_typed_tool_works_without_create_and_release(tok):
    box = Toolbox({"duck": Duck()}, Limits())
    stats = ToolStats()

    async def go():
        async with box.session(SAMPLE, ChatFormat(tok), stats) as session:
            return await session.run(ParsedTurn("", [ToolCall("duck", {}, "d")]))

    messages, _ = asyncio.run(go())
    box.close()
    assert messages[0]["content"] == "quack None" and stats.errors == 0


# --- tools that block, fork, flood or hang the process ------------------------------------------------------------


class BlocksLoop(Tool):
    """An async tool that makes a blocking call: it would stall an event loop it ran on."""

    name = "blocks_loop"

    async def execute(self, arguments, state):
        time.sleep(3.0)
        return "late"


class Quick(Tool):
    name = "quick"

    async def execute(self, arguments, state):
        await asyncio.sleep(0)
        return "ok"


def test_an_async_tool_that_blocks_times_out_and_the_rollout_loop_keeps_running(tok):
    box = Toolbox({t.name: t(None) for t in (BlocksLoop, Quick)}, Limits())
    ticks = []

    async def ticker():
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    async def go():
        clock = asyncio.ensure_future(ticker())
        async with box.session(SAMPLE, ChatFormat(tok), ToolStats()) as session:
            ticks.clear()
            blocked, _ = await session.run(ParsedTurn("", [ToolCall("blocks_loop", {}, "b")]))
            during = len(ticks)
            await asyncio.sleep(1.0)  # the check that replaces the blocked tool loop (after 0.3 s)
            later, _ = await session.run(ParsedTurn("", [ToolCall("quick", {}, "q")]))
        clock.cancel()
        return blocked, later, during

    try:
        blocked, later, during = asyncio.run(go())
    finally:
        box.close()
    assert blocked[0]["content"] == "Error: the tool 'blocks_loop' did not answer within 0.3 s " \
                                    "(rollout.agent.tool_timeout_s)"
    assert later[0]["content"] == "ok"  # on a fresh tool loop, while the blocked one still sleeps
    assert during >= 5  # the rollout's loop ran while the tool blocked (on it, it would tick once at most)


class BlocksBriefly(Tool):
    """An async tool that blocks its loop for a moment (a short blocking call in an ``async def``)."""

    name = "blocks_briefly"

    async def execute(self, arguments, state):
        time.sleep(0.02)
        return "done"


class BlockLimits(Limits):
    tool_timeout_s = 1.5


def test_a_call_that_finished_is_answered_while_another_blocks_the_tool_loop(tok):
    """The brief call is answered as soon as it returns, though the long one then holds the tool loop past the
    timeout (its result would otherwise wait for the loop: both would time out)."""
    box = Toolbox({t.name: t(None) for t in (BlocksBriefly, BlocksLoop)}, BlockLimits())

    async def go():
        async with box.session(SAMPLE, ChatFormat(tok), ToolStats()) as session:
            return await session.run(ParsedTurn("", [ToolCall("blocks_briefly", {}, "a"),
                                                     ToolCall("blocks_loop", {}, "b")]))

    try:
        messages, _ = asyncio.run(go())
    finally:
        box.close()
    assert messages[0]["content"] == "done"
    assert messages[1]["content"].startswith("Error: the tool 'blocks_loop' did not answer within 1.5 s")


class Forks(Tool):
    name = "forks"

    def execute(self, arguments, state):
        pid = os.fork()
        return "child" if pid == 0 else f"parent {pid}"  # the child returns too


class PatientLimits(Limits):
    tool_timeout_s = 30.0  # forking a large test process on a loaded machine can take longer than 0.3 s


def test_a_forked_child_of_a_tool_ends_where_the_tool_returns(tok):
    messages, _, stats = run_calls(tok, [Forks], ["forks"], limits=PatientLimits)
    reply = messages[0]["content"]
    assert reply.startswith("parent ") and stats.errors == 0
    _, status = os.waitpid(int(reply.split()[1]), 0)
    assert os.waitstatus_to_exitcode(status) == 0  # it exited at once, never running rlforge's code


class Flood(Tool):
    name = "flood"

    def execute(self, arguments, state):
        return "z" * 10_000_000


class CountingTokenizer:
    """The char tokenizer, recording the length of every text it encodes."""

    def __init__(self, tok):
        self.tok, self.lengths = tok, []

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def encode(self, text, **kwargs):
        self.lengths.append(len(text))
        return self.tok.encode(text, **kwargs)


def test_a_10_mb_reply_is_cut_before_it_is_tokenized(tok):
    counting = CountingTokenizer(tok)
    messages, _, _ = run_calls(counting, [Flood], ["flood"])
    assert messages[0]["content"].endswith(TRUNCATION_MARKER)
    assert max(counting.lengths) <= 64 * Limits.max_tool_output_tokens  # chat.CHARS_PER_TOKEN per allowed token


class Surrogates(Tool):
    name = "surrogates"

    def execute(self, arguments, state):
        return "bad \udcff bytes"  # e.g. program output decoded with surrogateescape


def test_lone_surrogates_in_replies_and_names_are_encodable(tok):
    messages, _, stats = run_calls(tok, [Surrogates], ["surrogates", "\ud800"])
    assert messages[0]["content"] == "bad \udcff bytes" and "there is no tool" in messages[1]["content"]
    chat = ChatFormat(tok)
    assert chat.encode(messages[0]["content"]) == chat.encode("bad ? bytes")
    assert chat.inserted_ids(messages)  # a tokenizer would raise on the surrogate itself


HUNG_TOOLS = textwrap.dedent("""
    import asyncio, time
    from rlforge.agent import ParsedTurn, Sample, Tool, ToolCall
    from rlforge.agent.chat import ChatFormat
    from rlforge.agent.toolbox import Toolbox
    from rlforge.agent.types import ToolStats

    class Chars:  # a tokenizer with a chat template, without loading transformers
        def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=False):
            return "".join(f"<{m['role']}>{m['content']}</>" for m in messages) + "<assistant>" * add_generation_prompt
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]
        def decode(self, ids, skip_special_tokens=False):
            return "".join(map(chr, ids))

    class Sleeps(Tool):
        name = "sleeps"
        def execute(self, arguments, state):
            time.sleep(3600)

    class Blocks(Tool):
        name = "blocks"
        async def execute(self, arguments, state):
            time.sleep(3600)

    class Limits:
        max_tool_calls_per_turn, tool_timeout_s, max_tool_output_tokens = 4, 0.2, 100
        tool_output_truncate_side = "right"

    box = Toolbox({"sleeps": Sleeps(None), "blocks": Blocks(None)}, Limits())

    async def go():
        async with box.session(Sample([], [1], "", None, None, "u", 0), ChatFormat(Chars()), ToolStats()) \
                as session:
            calls = [ToolCall("sleeps", {}, "s"), ToolCall("blocks", {}, "b")]
            return await session.run(ParsedTurn("", calls))

    messages, _ = asyncio.run(go())
    box.close()
    print([m["content"][:39] for m in messages], flush=True)
""")


def test_hung_tools_do_not_keep_the_process_alive():
    done = subprocess.run([sys.executable, "-c", HUNG_TOOLS], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(["Error: the tool 'sleeps' did not answer", "Error: the tool 'blocks' did not "
                                       "answer"])


def test_a_retired_tool_loop_runs_its_queued_calls_then_stops():
    """A tool loop replaced because a tool blocked it keeps running the calls already queued on it (they still get
    their answers within their own timeouts), and stops once they are done."""
    import threading

    from rlforge.agent.workers import ToolLoop

    gate = threading.Event()
    loop = ToolLoop("test-retire")

    async def blocker():
        gate.wait(10)  # blocks the loop, as a blocking call in an async tool does
        return "blocker"

    async def queued():
        return "queued"

    first, second = loop.submit(blocker()), loop.submit(queued())
    loop.retire()
    gate.set()
    assert (first.result(10), second.result(10)) == ("blocker", "queued")
    loop.thread.join(10)
    assert not loop.thread.is_alive()
