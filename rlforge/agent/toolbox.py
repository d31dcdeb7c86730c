"""Runs the tools of a trajectory: per-trajectory state, a timeout per call, truncated replies, and an error reply
(never a crash) for a tool that raises, hangs, returns something other than text, or is not there."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from rlforge.agent.base import ParsedTurn, Sample, Tool, ToolCall, ToolError, ToolResult, maybe_await
from rlforge.errors import RLForgeError

if TYPE_CHECKING:
    from rlforge.agent.chat import ChatFormat
    from rlforge.agent.trajectory import ToolStats

log = logging.getLogger("rlforge.agent")
TOOL_THREADS = 16  # threads that run sync tools (a hung sync tool holds one until it returns)


class Toolbox:
    """The run's tools by name, with the limits of ``rollout.agent`` (``tool_timeout_s``, ``max_tool_output_tokens``,
    ``max_tool_calls_per_turn``)."""

    def __init__(self, tools: dict[str, Tool], limits: Any) -> None:
        for name, tool in tools.items():
            declared = tool.schema().get("function", {}).get("name")
            if declared != name:
                raise RLForgeError(f"Tool '{name}' (rollout.agent.tools) declares the function name {declared!r} in "
                                   f"its schema; it must be its registered name '{name}'.")
        self.tools = tools
        self.limits = limits
        self._executor: ThreadPoolExecutor | None = None

    def schemas(self) -> list[dict[str, Any]]:
        return [tool.schema() for tool in self.tools.values()]

    def session(self, sample: Sample, chat: ChatFormat, stats: ToolStats) -> ToolSession:
        """``async with toolbox.session(sample, chat, stats) as tools: replies, reward = await tools.run(parsed)``."""
        return ToolSession(self, sample, chat, stats)

    async def call(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``: awaited if async, else in a tool thread (so the event loop keeps running). A tool's
        ``sys.exit()`` becomes a ``RuntimeError`` (asyncio would stop the whole run on a ``SystemExit``)."""
        try:
            if inspect.iscoroutinefunction(fn):
                return await fn(*args)
            if self._executor is None:
                self._executor = ThreadPoolExecutor(TOOL_THREADS, thread_name_prefix="rlforge-tool")
            result = await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
            return await maybe_await(result)
        except SystemExit as exc:
            raise RuntimeError(f"sys.exit({exc.code!r}) called") from None

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


class ToolSession:
    """The tools of one trajectory: ``create`` on a tool's first call, ``release`` when the trajectory ends."""

    def __init__(self, box: Toolbox, sample: Sample, chat: ChatFormat, stats: ToolStats) -> None:
        self.box, self.sample, self.chat, self.stats = box, sample, chat, stats
        self.states: dict[str, asyncio.Future[Any]] = {}  # each tool's create(), run once per trajectory

    async def __aenter__(self) -> ToolSession:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for name, created in self.states.items():
            if not created.done() or created.cancelled() or created.exception() is not None:
                continue
            release = getattr(self.box.tools[name], "release", None)  # optional outside the Tool base class
            try:
                if release is not None:
                    await self.box.call(release, created.result())
            except Exception as err:  # the trajectory is done; a failed release must not fail the run
                log.warning("Tool '%s': release() raised %s: %s", name, type(err).__name__, err)

    async def run(self, parsed: ParsedTurn) -> tuple[list[dict[str, Any]], float]:
        """The tool messages answering one model turn (its calls, concurrently, then one per unreadable call) and
        the sum of the tools' rewards."""
        limit = self.box.limits.max_tool_calls_per_turn
        calls, extra = parsed.calls[:limit], parsed.calls[limit:]
        results = await asyncio.gather(*(self._call(c) for c in calls))
        messages = [_message(c.name, c.id, text) for c, (text, _) in zip(calls, results)]
        for c in extra:
            self.stats.errors += 1
            messages.append(_message(c.name, c.id, f"Error: only {limit} tool calls per turn are run "
                                                   f"(rollout.agent.max_tool_calls_per_turn); this one was not."))
        for reason in parsed.errors:
            self.stats.parse_errors += 1
            messages.append(_message("", "", f"Error: the tool call could not be read: {reason}"))
        return messages, sum(r for _, r in results)

    async def _call(self, call: ToolCall) -> tuple[str, float]:
        self.stats.calls += 1
        start = time.perf_counter()
        try:
            text, reward = await asyncio.wait_for(self._execute(call), self.box.limits.tool_timeout_s)
        except asyncio.TimeoutError:
            text, reward = self._error(f"the tool '{call.name}' did not answer within "
                                       f"{self.box.limits.tool_timeout_s:g} s (rollout.agent.tool_timeout_s)"), 0.0
        except ToolError as exc:
            text, reward = self._error(str(exc)), 0.0
        except Exception as exc:
            text, reward = self._error(f"the tool '{call.name}' failed: {type(exc).__name__}: {exc}"), 0.0
        self.stats.seconds.append(time.perf_counter() - start)
        text, _ = self.chat.truncate(text, self.box.limits.max_tool_output_tokens)
        return text, reward

    async def _execute(self, call: ToolCall) -> tuple[str, float]:
        tool = self.box.tools.get(call.name)
        if tool is None:
            known = ", ".join(self.box.tools) or "(none)"
            raise ToolError(f"there is no tool '{call.name}'. Available tools: {known}")
        if call.name not in self.states:  # concurrent calls of one tool share the state
            create = getattr(tool, "create", None) or (lambda sample: None)
            self.states[call.name] = asyncio.ensure_future(self.box.call(create, self.sample))
        state = await asyncio.shield(self.states[call.name])
        result = await self.box.call(tool.execute, call.arguments, state)
        if isinstance(result, ToolResult) and isinstance(result.text, str):
            if not isinstance(result.reward, (int, float)) or not math.isfinite(result.reward):
                raise ToolError(f"the tool '{call.name}' returned the reward {result.reward!r}, not a finite number")
            return result.text, float(result.reward)
        if isinstance(result, str):
            return result, 0.0
        raise ToolError(f"the tool '{call.name}' returned {type(result).__name__} ({result!r:.80}), not text")

    def _error(self, message: str) -> str:
        self.stats.errors += 1
        return f"Error: {message}"


def _message(name: str, call_id: str, text: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "tool", "content": text}
    if name:
        message["name"] = name
    if call_id:
        message["tool_call_id"] = call_id
    return message

