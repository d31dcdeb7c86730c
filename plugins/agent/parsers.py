"""Tool-call parsers: ``hermes`` (Hermes / Qwen2.5 / Qwen3: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``).

A parser reads text a model wrote, so it must never raise on it: every call that cannot be read becomes a parse error
(the model gets it as an error reply), whatever its size, nesting depth or characters, and the cost stays linear in
the length of the text.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from rlforge.agent import ParsedTurn, ToolCall, ToolParser
from rlforge.hookspecs import hookimpl

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_SHAPE = '{"name": "<tool>", "arguments": {...}}'
MAX_DEPTH = 64  # deepest nesting of a call's JSON (objects and arrays); deeper is a parse error


class HermesParser(ToolParser):
    """Each call is a JSON object ``{"name": ..., "arguments": {...}}`` between ``<tool_call>`` and ``</tool_call>``;
    the text outside the calls is the turn's content. A call that is not such an object (bad JSON, JSON nested
    deeper than ``MAX_DEPTH``, no name, arguments that are not an object, a missing ``</tool_call>``) becomes a parse
    error, not a call."""

    def parse(self, text: str) -> ParsedTurn:
        calls: list[ToolCall] = []
        errors: list[str] = []
        content: list[str] = []
        pos = 0
        while (start := text.find(OPEN, pos)) >= 0:  # str.find, not a regex: linear in the text whatever it holds
            end = text.find(CLOSE, start + len(OPEN))
            content.append(text[pos:start])
            if end < 0:
                errors.append(f"a {OPEN} has no {CLOSE}; write each call as {OPEN}{_SHAPE}{CLOSE}")
                pos = len(text)
                break
            call = self._call(text[start + len(OPEN):end].strip(), errors)
            if call is not None:
                calls.append(call)
            pos = end + len(CLOSE)
        content.append(text[pos:])
        return ParsedTurn("".join(content).strip(), calls, errors)

    @staticmethod
    def _call(body: str, errors: list[str]) -> ToolCall | None:
        too_deep = f"the call is nested deeper than {MAX_DEPTH} levels in {body!r:.200}; expected {_SHAPE}"
        try:
            obj: Any = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(f"not valid JSON ({exc.msg} at character {exc.pos}) in {body!r:.200}; expected {_SHAPE}")
            return None
        except RecursionError:  # the C decoder's own depth limit (about 1,000 levels)
            errors.append(too_deep)
            return None
        if _depth(obj) > MAX_DEPTH:  # tools, templates and json.dumps recurse over the arguments later
            errors.append(too_deep)
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            errors.append(f"expected {_SHAPE}, got {body!r:.200}")
            return None
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models write the arguments as a JSON string, as OpenAI messages carry them
            try:
                args = json.loads(args) if args.strip() else {}
            except (json.JSONDecodeError, RecursionError):
                pass
            if _depth(args) > MAX_DEPTH:
                errors.append(too_deep)
                return None
        if not isinstance(args, dict):
            errors.append(f"the arguments of {obj['name']!r} must be a JSON object, got {args!r:.200}")
            return None
        return ToolCall(obj["name"], args, f"call_{uuid.uuid4().hex[:16]}")


def _depth(value: Any) -> int:
    """Nesting depth of decoded JSON (a scalar is 0), without recursion."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        item, level = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level + 1)
        if deepest > MAX_DEPTH:
            return deepest
        todo.extend((child, level + 1) for child in children)
    return deepest


def format_call(call: ToolCall) -> str:
    """A call as the model writes it in this format."""
    return f"{OPEN}{json.dumps({'name': call.name, 'arguments': call.arguments}, ensure_ascii=False)}{CLOSE}"


@hookimpl
def rlforge_register(registry):
    registry.tool_parser.register("hermes", HermesParser)
