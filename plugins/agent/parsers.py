"""Tool-call parsers: ``hermes`` (Hermes / Qwen2.5 / Qwen3: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``)."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from rlforge.agent import ParsedTurn, ToolCall, ToolParser
from rlforge.hookspecs import hookimpl

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
_SHAPE = '{"name": "<tool>", "arguments": {...}}'


class HermesParser(ToolParser):
    """Each call is a JSON object ``{"name": ..., "arguments": {...}}`` between ``<tool_call>`` and ``</tool_call>``;
    the text outside the calls is the turn's content. A call that is not such an object (bad JSON, no name,
    arguments that are not an object, a missing ``</tool_call>``) becomes a parse error, not a call."""

    def parse(self, text: str) -> ParsedTurn:
        calls: list[ToolCall] = []
        errors: list[str] = []
        for match in _CALL.finditer(text):
            call = self._call(match.group(1).strip(), errors)
            if call is not None:
                calls.append(call)
        content = _CALL.sub("", text)
        if OPEN in content:
            errors.append(f"a {OPEN} has no {CLOSE}; write each call as {OPEN}{_SHAPE}{CLOSE}")
            content = content[:content.index(OPEN)]
        return ParsedTurn(content.strip(), calls, errors)

    @staticmethod
    def _call(body: str, errors: list[str]) -> ToolCall | None:
        try:
            obj: Any = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(f"not valid JSON ({exc.msg} at character {exc.pos}) in {body!r:.200}; expected {_SHAPE}")
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            errors.append(f"expected {_SHAPE}, got {body!r:.200}")
            return None
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models write the arguments as a JSON string, as OpenAI messages carry them
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                pass
        if not isinstance(args, dict):
            errors.append(f"the arguments of '{obj['name']}' must be a JSON object, got {args!r:.200}")
            return None
        return ToolCall(obj["name"], args, f"call_{uuid.uuid4().hex[:16]}")


def format_call(call: ToolCall) -> str:
    """A call as the model writes it in this format."""
    return f"{OPEN}{json.dumps({'name': call.name, 'arguments': call.arguments}, ensure_ascii=False)}{CLOSE}"


@hookimpl
def rlforge_register(registry):
    registry.tool_parser.register("hermes", HermesParser)
