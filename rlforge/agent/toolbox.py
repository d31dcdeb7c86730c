"""Runs the tools of a trajectory: per-trajectory state, a timeout per call, truncated replies, and an error reply
(never a crash) for a tool that raises, hangs, blocks, exits, returns something other than text, or is not there.
Tool code never runs on the rollout's event loop (``rlforge.agent.workers``)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import re
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from rlforge.agent.base import Tool
from rlforge.agent.chat import valid_text
from rlforge.agent.types import ParsedTurn, Sample, ToolCall, ToolError, ToolResult, ToolStats
from rlforge.agent.workers import DaemonThreads, ToolLoop
from rlforge.errors import RLForgeError, first_line
from rlforge.multimodal import IMAGE_PLACEHOLDER, open_images

if TYPE_CHECKING:
    from rlforge.agent.chat import ChatFormat

log = logging.getLogger("rlforge.agent")
_FAILED: set[str] = set()  # the tools whose first failure was logged (Calls._error)
TOOL_THREADS = 16  # daemon threads that run sync tools (a hung sync tool holds one until it returns)
MAX_BLOCKED_LOOPS = 8  # tool event loops replaced after an async tool blocked them; then async calls share the last
STALL_PROBE_S = 1.0  # after an async call timed out: a tool loop that runs no callback within this is blocked


class Toolbox:
    """The run's tools by name, with the limits of ``rollout.agent`` (``tool_timeout_s``, ``max_tool_output_tokens``,
    ``max_tool_calls_per_turn``)."""

    def __init__(self, tools: dict[str, Tool], limits: Any) -> None:
        for name, tool in tools.items():
            function = tool.schema().get("function", {})
            declared = function.get("name")
            if declared != name:
                raise RLForgeError(f"Tool '{name}' (rollout.agent.tools) declares the function name {declared!r} in "
                                   f"its schema; it must be its registered name '{name}'.")
            parameters = function.get("parameters", {})
            if not isinstance(parameters, dict):
                raise RLForgeError(f"Tool '{name}' (rollout.agent.tools) declares 'parameters' of type "
                                   f"{type(parameters).__name__} in its schema: it must be a JSON-schema object, e.g. "
                                   f"{{\"type\": \"object\", \"properties\": {{\"x\": {{\"type\": \"string\"}}}}}}.")
        self.tools = tools
        self.limits = limits
        self._threads: DaemonThreads | None = None
        self._loop: ToolLoop | None = None
        self._blocked_loops: list[ToolLoop] = []  # replaced after a tool blocked them (their threads are daemons)
        self._checks: set[asyncio.Task[None]] = set()  # running _replace_if_blocked (the loop keeps weak references)

    def schemas(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        """The tools' schemas (``names``: of these tools only, in that order)."""
        return [tool.schema() for tool in self.tools.values()] if names is None else [
            self.tools[name].schema() for name in names if name in self.tools]

    def session(self, sample: Sample, chat: ChatFormat, stats: ToolStats, names: list[str] | None = None
                ) -> ToolSession:
        """``async with toolbox.session(sample, chat, stats) as tools: replies, reward = await tools.run(parsed)``;
        ``names``: only these tools can be called."""
        return ToolSession(self, sample, chat, stats, names)

    async def call(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` off the rollout's event loop: a sync function in a daemon tool thread, an async one (or the
        awaitable a sync one returns) on the tool event loop. Cancelling the call (its timeout) leaves the rollout's
        loop free whatever the tool does; a tool's ``sys.exit()`` becomes a ``RuntimeError``."""
        if inspect.iscoroutinefunction(fn):
            return await self._on_tool_loop(fn(*args))
        if self._threads is None:
            self._threads = DaemonThreads(TOOL_THREADS, "rlforge-tool")
        result = await asyncio.wrap_future(self._threads.submit(fn, *args))
        return await self._on_tool_loop(result) if inspect.isawaitable(result) else result

    async def _on_tool_loop(self, awaitable: Awaitable[Any]) -> Any:
        if self._loop is None:
            self._loop = ToolLoop("rlforge-tool-loop")
        loop = self._loop
        try:
            return await asyncio.wrap_future(loop.submit(awaitable))
        except asyncio.CancelledError:
            check = asyncio.ensure_future(self._replace_if_blocked(loop))  # a timeout: was the tool loop blocked?
            self._checks.add(check)
            check.add_done_callback(self._checks.discard)
            raise

    async def _replace_if_blocked(self, loop: ToolLoop) -> None:
        if loop is not self._loop or len(self._blocked_loops) >= MAX_BLOCKED_LOOPS:
            return
        if not await loop.responsive(min(STALL_PROBE_S, self.limits.tool_timeout_s)) and loop is self._loop:
            self._blocked_loops.append(loop)
            loop.retire()
            self._loop = ToolLoop(f"rlforge-tool-loop-{len(self._blocked_loops)}")
            log.warning("An async tool blocked its event loop past rollout.agent.tool_timeout_s=%g s (a blocking call "
                        "in an 'async def' tool?); later async tool calls run on a fresh loop (%d of at most %d "
                        "replaced).", self.limits.tool_timeout_s, len(self._blocked_loops), MAX_BLOCKED_LOOPS)

    def close(self) -> None:
        if self._threads is not None:
            self._threads.close()
            self._threads = None
        if self._loop is not None:
            self._loop.close()
            self._loop = None


class ToolSession:
    """The tools of one trajectory: ``create`` on a tool's first call, ``release`` when the trajectory ends."""

    def __init__(self, box: Toolbox, sample: Sample, chat: ChatFormat, stats: ToolStats,
                 names: list[str] | None = None) -> None:
        self.box, self.sample, self.chat, self.stats = box, sample, chat, stats
        self.tools = box.tools if names is None else {n: t for n, t in box.tools.items() if n in names}
        self.states: dict[str, asyncio.Future[Any]] = {}  # each tool's create(), run once per trajectory

    async def __aenter__(self) -> ToolSession:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for name, created in self.states.items():
            tool = self.tools[name]
            if not isinstance(tool, Tool) or not created.done() or created.cancelled() or created.exception() is not None:
                continue  # per-trajectory state is the Tool base class's (create/release)
            try:
                await self.box.call(tool.release, created.result())
            except Exception as err:  # the trajectory is done; a failed release must not fail the run
                log.warning("Tool '%s': release() raised %s: %s", name, type(err).__name__, err)

    async def run(self, parsed: ParsedTurn) -> tuple[list[dict[str, Any]], float]:
        """The tool messages answering one model turn (its calls, concurrently, then one per unreadable call) and
        the sum of the tools' rewards."""
        limit = self.box.limits.max_tool_calls_per_turn
        calls, extra = parsed.calls[:limit], parsed.calls[limit:]
        results = await asyncio.gather(*(self._call(c) for c in calls))
        messages = [_message(c.name, c.id, text, images) for c, (text, _, images) in zip(calls, results)]
        for c in extra:
            self.stats.errors += 1
            messages.append(_message(c.name, c.id, self._cut(f"Error: only {limit} tool calls per turn are run "
                                                             f"(rollout.agent.max_tool_calls_per_turn); this one was "
                                                             f"not.")))
        for reason in parsed.errors:  # cut as every reply is (helper-83: a 210-token one never fit the budget)
            self.stats.parse_errors += 1
            messages.append(_message("", "", self._cut(f"Error: the tool call could not be read: {reason}")))
        return messages, sum(r for _, r, _ in results)

    def _cut(self, text: str) -> str:
        """``text`` cut to ``rollout.agent.max_tool_output_tokens``, as every reply to the model is."""
        limits = self.box.limits
        return self.chat.truncate(text, limits.max_tool_output_tokens, limits.tool_output_truncate_side)[0]

    async def _call(self, call: ToolCall) -> tuple[str, float, list[Any]]:
        self.stats.calls += 1
        start = time.perf_counter()
        images: list[Any] = []
        try:
            text, reward, images = await asyncio.wait_for(self._execute(call), self.box.limits.tool_timeout_s)
        except asyncio.TimeoutError:
            text, reward = self._error(f"the tool '{call.name}' did not answer within "
                                       f"{self.box.limits.tool_timeout_s:g} s (rollout.agent.tool_timeout_s)",
                                       call.name), 0.0
        except ToolError as exc:
            text, reward = self._error(str(exc), call.name), 0.0
        except Exception as exc:
            text, reward = self._error(f"the tool '{call.name}' failed: {type(exc).__name__}: {exc}", call.name), 0.0
        self.stats.seconds.append(time.perf_counter() - start)
        return self._cut(text), reward, images

    async def _execute(self, call: ToolCall) -> tuple[str, float, list[Any]]:
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(self.tools) or "(none)"
            raise ToolError(f"there is no tool '{call.name}'. Available tools: {known}")
        if call.name not in self.states:  # concurrent calls of one tool share the state
            create = tool.create if isinstance(tool, Tool) else _no_state  # a tool without the base class: no state
            self.states[call.name] = asyncio.ensure_future(self.box.call(create, self.sample))
        state = await asyncio.shield(self.states[call.name])
        result = await self.box.call(tool.execute, call.arguments, state)
        if isinstance(result, ToolResult) and isinstance(result.text, str):
            if not isinstance(result.reward, (int, float)) or not math.isfinite(result.reward):
                raise ToolError(f"the tool '{call.name}' returned the reward {result.reward!r}, not a finite number")
            images = await self.box.call(self._images, call.name, result) if result.images else []  # a tool thread
            return result.text, float(result.reward), images
        if isinstance(result, str):
            return result, 0.0, []
        raise ToolError(f"the tool '{call.name}' returned {type(result).__name__} ({result!r:.80}), not text")

    def _images(self, name: str, result: ToolResult) -> list[Any]:
        """A reply's images, opened and checked by the image processor; a text model gets an error reply instead."""
        if self.chat.processor is None:
            raise ToolError(f"the tool '{name}' replied with images, which a text model cannot see (model.path has "
                            f"no image processor)")
        if IMAGE_PLACEHOLDER in result.text:
            raise ToolError(f"the tool '{name}' replied with images and a text holding {IMAGE_PLACEHOLDER}: the images "
                            f"(ToolResult.images) are shown before the text, which must not mark places for them")
        images = open_images(result.images, f"the reply of the tool '{name}'", "images")
        for n, image in enumerate(images):  # one the processor refuses (0 pixels, a 1 x 4000 strip) is the tool's error
            try:
                self.chat.processor.image_processor(images=[image], return_tensors="pt")
            except Exception as exc:
                raise ToolError(f"the tool '{name}' replied with an image the model's image processor cannot take "
                                f"(images[{n}], {image.width} x {image.height} pixels: {type(exc).__name__}: "
                                f"{first_line(exc)})") from None
        return images

    def _error(self, message: str, tool: str = "") -> str:
        """The error reply the model gets (counted in ``agent/tool_errors``); a tool's first failure in this process
        is also logged, whole (the reply may be cut), so that its author sees it."""
        self.stats.errors += 1
        if tool and tool not in _FAILED:
            _FAILED.add(tool)
            log.warning("Tool %r failed (sample %s): %s. The model gets an error reply; later failures of this tool are "
                        "only counted in agent/tool_errors.", valid_text(tool), self.sample.index, valid_text(message))
        return "Error: " + re.sub(r" at 0x[0-9a-fA-F]+", "", message)  # no memory address: the reply is trained on


def _no_state(sample: Sample) -> None:
    """The state of a tool that does not subclass :class:`rlforge.agent.Tool` (which defines ``create``)."""
    return None


def _message(name: str, call_id: str, text: str, images: list[Any] | tuple[()] = ()) -> dict[str, Any]:
    """A tool message; its images (``images``) go before the text, one ``<image>`` placeholder each."""
    message: dict[str, Any] = {"role": "tool", "content": IMAGE_PLACEHOLDER * len(images) + text}
    if images:
        message["images"] = images
    if name:
        message["name"] = name
    if call_id:
        message["tool_call_id"] = call_id
    return message

