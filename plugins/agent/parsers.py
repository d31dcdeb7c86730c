"""Tool-call parsers: ``hermes`` (Hermes / Qwen2.5 / Qwen3: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
after a ``<think>...</think>`` block read as reasoning) and ``tokenizer`` (the model's own format: transformers'
``tokenizer.parse_response`` with the tokenizer's ``response_template``).

A parser reads text a model wrote, so it must never raise on it: every call that cannot be read becomes a parse error
(the model gets it as an error reply), whatever its size, nesting depth or characters. ``hermes`` costs time linear in
the length of the text; ``tokenizer`` costs what transformers' parser takes with the model's template
(docs/agentic.md, "Tool-call formats").
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from rlforge.agent import ParsedTurn, ToolCall, ToolParser
from rlforge.errors import ConfigError, RLForgeError, first_line
from rlforge.hookspecs import hookimpl

OPEN, CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"  # reasoning (Qwen3, DeepSeek-R1): not part of the content
_SHAPE = '{"name": "<tool>", "arguments": {...}}'
MAX_DEPTH = 64  # deepest nesting of a call's JSON (objects and arrays); deeper is a parse error


class HermesParser(ToolParser):
    """Each call is a JSON object ``{"name": ..., "arguments": {...}}`` between ``<tool_call>`` and ``</tool_call>``;
    the text outside the calls is the turn's content. Text up to a ``</think>`` is reasoning (``split_reasoning``):
    calls written in it are not calls, as vLLM's reasoning parsers read them. A call that is not such an object (bad
    JSON, JSON nested deeper than ``MAX_DEPTH``, no name, arguments that are not an object, a missing
    ``</tool_call>``) becomes a parse error, not a call."""

    def parse(self, text: str) -> ParsedTurn:
        reasoning, text = split_reasoning(text)
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
        return ParsedTurn("".join(content).strip(), calls, errors, reasoning)

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
        return _tool_call(obj["name"], obj.get("arguments", {}), too_deep, errors)


def split_reasoning(text: str) -> tuple[str, str]:
    """``(reasoning, the rest)``: the text before the first ``</think>`` (from its ``<think>``, or from the start
    when the chat template prefilled the opener) is reasoning; without ``</think>`` there is none."""
    end = text.find(THINK_CLOSE)
    if end < 0:
        return "", text
    start = text.find(THINK_OPEN, 0, end)
    head = text[start + len(THINK_OPEN):end] if start >= 0 else text[:end]
    return head.strip(), (text[:start] if start >= 0 else "") + text[end + len(THINK_CLOSE):]


def _tool_call(name: str, args: Any, too_deep: str, errors: list[str]) -> ToolCall | None:
    """The call of ``name`` with ``args`` (an object, or the JSON text of one); None, with an error, otherwise."""
    if isinstance(args, str):  # some models write the arguments as a JSON string, as OpenAI messages carry them
        try:
            args = json.loads(args) if args.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            pass
        if _depth(args) > MAX_DEPTH:
            errors.append(too_deep)
            return None
    if not isinstance(args, dict):
        errors.append(f"the arguments of {name!r} must be a JSON object, got {args!r:.200}")
        return None
    return ToolCall(name, args, f"call_{uuid.uuid4().hex[:16]}")


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


class TokenizerParser(ToolParser):
    """The model's own call format: its tokenizer's ``response_template``, read by ``tokenizer.parse_response``.

    The template is saved in the tokenizer's ``tokenizer_config.json``; transformers parses with it. The turn is read after the chat template's
    generation prompt, so a template that prefills an opener (``<think>``) is read as the model continues it. The
    turn's content is the message's ``content``; arguments written as text (``<parameter=n>7</parameter>``) are cast
    by the schema of a tool of ``rollout.agent.tools``; reasoning the template puts in a field of its own
    (``thinking``) is not part of it: it is the turn's ``reasoning``. A turn the template cannot read (a call that is not JSON, a required field
    missing) is one parse error; a call without a name or whose arguments are not an object (or nested deeper than
    ``MAX_DEPTH``) is a parse error, the turn's other calls stand."""

    tokenizer: Any = None
    prefix = ""  # the chat template's generation prompt (after the last anchor: what the model continues)
    tools: list[dict[str, Any]] | None = None  # the run's tool schemas (rollout.agent.tools)

    def bind(self, context: Any) -> None:
        chat = context.chat
        tokenizer = chat.tokenizer
        template = getattr(tokenizer, "response_template", None)
        if not callable(getattr(tokenizer, "parse_response", None)) or not template:
            raise ConfigError("rollout.agent.tool_parser=tokenizer reads tool calls with the tokenizer's "
                              "response_template (transformers' tokenizer.parse_response), and this model's tokenizer "
                              "has none: add a 'response_template' to its tokenizer_config.json, or use "
                              "rollout.agent.tool_parser=hermes.")
        from transformers.utils.chat_parsing.response_templates import load_response_template

        try:
            load_response_template(template)
        except (ValueError, TypeError, AttributeError) as exc:
            raise ConfigError(f"rollout.agent.tool_parser=tokenizer: the tokenizer's response_template is not valid: "
                              f"{type(exc).__name__}: {exc}") from None
        self.tokenizer, self.prefix = tokenizer, chat.render([{"role": "user", "content": ""}])
        self.tools = context.tools.schemas()  # arguments written as text are cast by the tool's JSON schema

    def parse(self, text: str) -> ParsedTurn:
        if self.tokenizer is None:
            raise RLForgeError("TokenizerParser.parse needs bind(chat) first (AgentContext binds the run's parser)")
        try:
            message = self.tokenizer.parse_response(text, prefix=self.prefix, tools=self.tools)
        except Exception as exc:  # the template's own parsers failed on the model's text (json, regex, recursion)
            return ParsedTurn(text.strip(), [], [f"the turn does not follow the model's response_template "
                                                 f"({type(exc).__name__}: {first_line(exc):.200}) in {text!r:.200}"])
        calls: list[ToolCall] = []
        errors: list[str] = []
        for raw in message.get("tool_calls") or []:
            fn = raw.get("function", raw) if isinstance(raw, dict) else raw
            too_deep = f"the call is nested deeper than {MAX_DEPTH} levels: {fn!r:.200}"
            if _depth(fn) > MAX_DEPTH:
                errors.append(too_deep)
            elif not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                errors.append(f"a tool call without a name: {raw!r:.200}")
            elif (call := _tool_call(fn["name"], fn.get("arguments", {}), too_deep, errors)) is not None:
                calls.append(call)
        content = message.get("content") or ""
        if not isinstance(content, str):  # a template that parses the content as JSON
            content = json.dumps(content, ensure_ascii=False) if _depth(content) <= MAX_DEPTH else ""
        reasoning = message.get("thinking") or message.get("reasoning_content") or ""
        return ParsedTurn(content.strip(), calls, errors, reasoning.strip() if isinstance(reasoning, str) else "")


@hookimpl
def rlforge_register(registry):
    registry.tool_parser.register("hermes", HermesParser)
    registry.tool_parser.register("tokenizer", TokenizerParser)
