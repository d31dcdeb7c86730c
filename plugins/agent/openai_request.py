"""The chat-completions request the ``openai_agent`` endpoint serves, checked field by field (docs/agentic.md).

Every field of a request is one of three kinds, and anything else is refused:

- implemented: ``messages``, ``tools``, ``max_tokens`` / ``max_completion_tokens``, ``logprobs``, ``stream`` and
  ``stream_options``, and the sampling fields ``temperature`` / ``top_p`` when they equal the rollout's own sampling
  (other values are refused: the trainer scores every token at the rollout's sampling, so a token sampled otherwise
  would be trained off-policy);
- accepted because the value asks for what the endpoint does anyway (``n=1``, ``tool_choice="auto"``,
  ``parallel_tool_calls=true``, ``response_format={"type": "text"}``, zero penalties, ...) or because the field
  does not change the completion (``model``, ``user``, ``metadata``);
- refused: one HTTP 400 names every unsupported field of the request, and nothing of it reaches the engine.

A JSON ``null`` is the field's default, as in OpenAI's API. Message ``content`` may be a string or a list of text
parts (``[{"type": "text", "text": ...}]``, joined with newlines as vLLM's server does).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlforge.agent.engine import OFF_POLICY, off_policy_fields
from rlforge.sampling import SamplingParams

ROLES = ("system", "developer", "user", "assistant", "tool")
NO_EFFECT = frozenset({"model", "user", "metadata"})  # accepted, and they change nothing in the completion


class RequestError(Exception):
    """A request the endpoint cannot serve: HTTP 400 with an OpenAI-style error body."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.code = param, code


@dataclass(frozen=True)
class ChatRequest:
    """A checked request: messages with their text content as a string, and the fields that shape the reply."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    max_tokens: int | None
    logprobs: bool
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the token counts


def _one_of(*values: Any) -> Callable[[Any], bool]:
    """Equal to one of ``values``, and a bool only where the value is one (``n=true`` is not ``n=1``)."""
    return lambda v: any(v == x and isinstance(v, bool) == isinstance(x, bool) for x in values)


# fields accepted only with the value the endpoint implements anyway: (check, what is supported and why)
DEFAULT_ONLY: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n": (_one_of(1), "only n=1: send one request per completion"),
    "stop": (lambda v: v in ("", []), "no stop sequences: the model stops at its end-of-turn token"),
    "tool_choice": (_one_of("auto"), "only 'auto': the model decides whether to call a tool (a call cannot be "
                                     "forced or forbidden without changing what it samples)"),
    "parallel_tool_calls": (_one_of(True), "only true: every call of a turn is returned"),
    "response_format": (lambda v: v == {"type": "text"}, "only {'type': 'text'}: there is no constrained decoding"),
    "presence_penalty": (_one_of(0), "only 0: a penalty changes what is sampled (off-policy tokens)"),
    "frequency_penalty": (_one_of(0), "only 0: a penalty changes what is sampled (off-policy tokens)"),
    "logit_bias": (lambda v: v == {}, "only empty: a bias changes what is sampled (off-policy tokens)"),
    "top_logprobs": (_one_of(0), "only 0: the engine reports the log-prob of the sampled token only"),
    "seed": (lambda v: False, "the rollout seeds its own sampling (trainer.seed)"),
    "store": (_one_of(False), "only false: nothing is stored"),
}
KNOWN = frozenset({*NO_EFFECT, *DEFAULT_ONLY, "messages", "tools", "max_tokens", "max_completion_tokens", "logprobs",
                   "stream", "stream_options", "temperature", "top_p"})


def parse_request(body: Any, sampling: SamplingParams) -> ChatRequest:
    """The checked request; one :class:`RequestError` naming every field the endpoint does not serve, before anything
    touches the conversation or joins a wave of engine calls. ``sampling``: the rollout's sampling parameters."""
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object with 'messages', got {type(body).__name__}")
    given = {k: v for k, v in body.items() if v is not None}
    if given.get("tool_choice") == "none" and not given.get("tools"):
        del given["tool_choice"]  # no tools offered: nothing to forbid
    unsupported = [(k, f"{k}={given[k]!r:.80} ({why})") for k, (ok, why) in DEFAULT_ONLY.items()
                   if k in given and not ok(given[k])]
    unsupported += [(k, f"{k} (not supported by the rlforge endpoint)") for k in given if k not in KNOWN]
    unsupported += _sampling_problems(given, sampling)
    if unsupported:
        raise RequestError("Unsupported request fields: " + "; ".join(text for _, text in unsupported),
                           ",".join(k for k, _ in unsupported), "unsupported_parameter")
    messages = given.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("the request needs 'messages', a non-empty list of chat messages", "messages")
    stream = _flag(given, "stream")
    options = given.get("stream_options", {})
    if options and not stream:
        raise RequestError("stream_options is only valid with stream=true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise RequestError(f"stream_options={options!r:.80}: only {{'include_usage': true|false}} is supported",
                           "stream_options")
    return ChatRequest(messages=[_message(i, m) for i, m in enumerate(messages)], tools=_tools(given.get("tools")),
                       max_tokens=_max_tokens(given), logprobs=_flag(given, "logprobs"), stream=stream,
                       include_usage=_flag(options, "include_usage", "stream_options.include_usage"))


def _sampling_problems(given: dict[str, Any], sampling: SamplingParams) -> list[tuple[str, str]]:
    """Out-of-range sampling values (refused, so that one agent's bad value cannot fail the engine call of a whole
    wave), then values other than the rollout's (off-policy)."""
    problems: list[tuple[str, str]] = []
    asked: dict[str, float] = {}
    for key, ok, accepted in (("temperature", lambda v: v >= 0, "a number >= 0"),
                              ("top_p", lambda v: 0 < v <= 1, "a number with 0 < top_p <= 1")):
        if key not in given:
            continue
        value = given[key]
        if not _finite(value) or not ok(value):
            problems.append((key, f"{key}={value!r:.40} (out of range: {key} must be {accepted})"))
        else:
            asked[key] = float(value)
    return problems + [(key, f"{key}={asked[key]:g} ({OFF_POLICY.format(key=key, value=ours)}; leave {key} out)")
                       for key, ours in off_policy_fields(asked, sampling)]


def _max_tokens(given: dict[str, Any]) -> int | None:
    limits = []
    for key in ("max_completion_tokens", "max_tokens"):
        if key not in given:
            continue
        value = given[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RequestError(f"{key}={value!r:.40} is out of range: {key} must be an integer >= 1", key)
        limits.append(value)
    return limits[0] if limits else None


def _flag(given: dict[str, Any], key: str, name: str | None = None) -> bool:
    value = given.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"{name or key}={value!r:.40} must be true or false", name or key)
    return value


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RequestError("'tools' must be a list of function schemas", "tools")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        kind = tool.get("type", "function") if isinstance(tool, dict) else None
        if kind != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}, got "
                               f"{tool!r:.80}", "tools")
    return tools


def _message(i: int, message: Any) -> dict[str, Any]:
    """A message with its content as one string (None -> ""), its tool calls' arguments decoded for the template."""
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise RequestError(f"{where} must be an object with 'role' and 'content', got {message!r:.80}", "messages")
    role = message.get("role")
    if role not in ROLES:
        raise RequestError(f"{where}.role={role!r:.40}: expected one of {', '.join(ROLES)}", "messages")
    out = {k: v for k, v in message.items() if v is not None}
    out["content"] = content_text(message.get("content"), f"{where}.content")
    if "tool_calls" in out:
        if role != "assistant" or not isinstance(out["tool_calls"], list):
            raise RequestError(f"{where}.tool_calls must be a list, on an assistant message", "messages")
        out["tool_calls"] = [_tool_call(f"{where}.tool_calls[{j}]", c) for j, c in enumerate(out["tool_calls"])]
    if "tool_call_id" in out and not isinstance(out["tool_call_id"], str):
        raise RequestError(f"{where}.tool_call_id must be a string", "messages")
    return out


def content_text(content: Any, where: str = "content") -> str:
    """The text of a message's ``content``: a string, None (""), or a list of text parts joined with newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where} must be a string or a list of text parts, got {type(content).__name__}",
                           "messages")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise RequestError(f"{where}[{j}]: only text parts {{'type': 'text', 'text': ...}} are supported, got "
                               f"{part!r:.80}", "messages")
        texts.append(part["text"])
    return "\n".join(texts)


def _tool_call(where: str, call: Any) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise RequestError(f"{where} must be {{'type': 'function', 'function': {{'name': ..., 'arguments': ...}}}}, "
                           f"got {call!r:.80}", "messages")
    arguments = fn.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI sends JSON text; chat templates expect the object
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            raise RequestError(f"{where}.function.arguments is not JSON: {arguments!r:.80}", "messages") from None
    if not isinstance(arguments, dict):
        raise RequestError(f"{where}.function.arguments must be a JSON object, got {arguments!r:.80}", "messages")
    return {**call, "function": {**fn, "arguments": arguments}}
