"""OpenAI's Responses API on the ``openai_agent`` endpoint (``POST <base_url>/responses``): what the OpenAI Agents SDK
speaks by default, served by translating it to and from a chat completion (``openai_recorder``).

A request's ``instructions`` and ``input`` items become chat messages (an assistant message item and the
``function_call`` items after it are one assistant turn; a ``function_call_output`` is a tool message; ``reasoning``
items, the model's own reasoning sent back, are dropped); its function tools, ``max_output_tokens`` and sampling
fields become their chat-completions fields, and every other field goes through the same checks, so an unsupported
one is a 400 naming it. The endpoint keeps no responses: ``previous_response_id`` and ``conversation`` are refused;
send the whole conversation in ``input``, as the Agents SDK does by default. The reply is a ``response`` object
(``reasoning``, ``message`` and ``function_call`` output items), or for ``stream=true`` its events, one
``response.output_text.delta`` per generated token.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from rlforge.plugins.agent.openai_recorder import Reply, token_deltas
from rlforge.plugins.agent.openai_request import RequestError

DEFAULTS = {"include": [], "truncation": "disabled", "text": {"format": {"type": "text"}}}  # what the endpoint does
RENAMED = {"max_output_tokens": "max_tokens"}  # Responses field -> chat-completions field
TEXT_PARTS = ("input_text", "output_text", "text")


def chat_body(body: Any) -> dict[str, Any]:
    """The chat-completions request of a Responses request (checked further by ``parse_request``)."""
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object with 'input', got {type(body).__name__}")
    out: dict[str, Any] = {}
    for key, value in body.items():
        if value is None or key in ("input", "instructions") or DEFAULTS.get(key, object()) == value:
            continue
        out[RENAMED.get(key, key)] = _tools(value) if key == "tools" else value
    messages = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise RequestError("the request needs 'input', a string or a non-empty list of items", "input")
    for i, item in enumerate(items):
        _add_item(messages, i, item)
    out["messages"] = messages
    return out


def _tools(tools: Any) -> Any:
    if not isinstance(tools, list):
        return tools  # parse_request names it
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise RequestError(f"tools[{i}]: only function tools are served, got {kind!r:.40} (hosted tools such as "
                               "web_search run on OpenAI's servers)", "tools")
        out.append({"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters")
                                                     if k in tool}})
    return out


def _add_item(messages: list[dict[str, Any]], i: int, item: Any) -> None:
    where = f"input[{i}]"
    if not isinstance(item, dict):
        raise RequestError(f"{where} must be an object, got {item!r:.80}", "input")
    kind = item.get("type", "message")
    if kind == "message":
        messages.append({"role": item.get("role"), "content": _text(where, item.get("content"))})
    elif kind == "function_call":
        call = {"id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}}
        last = messages[-1] if messages else None
        if last is None or last.get("role") != "assistant":  # else: the calls of the turn whose text came first
            last = {"role": "assistant", "content": ""}
            messages.append(last)
        last.setdefault("tool_calls", []).append(call)
    elif kind == "function_call_output":
        messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                         "content": _text(where, item.get("output"))})
    elif kind != "reasoning":
        raise RequestError(f"{where}: items of type {kind!r:.40} are not served (message, function_call, "
                           "function_call_output and reasoning are)", "input")


def _text(where: str, content: Any) -> Any:
    """A string, or the text of a list of ``input_text``/``output_text`` parts (other parts are refused)."""
    if not isinstance(content, list):
        return content
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise RequestError(f"{where}.content[{j}]: only text parts are served, got {part!r:.80}", "input")
        texts.append(part["text"])
    return "\n".join(texts)


def response(reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
    """The ``response`` object of a chat completion."""
    completion = reply.completion
    choice = completion["choices"][0]
    message = choice["message"]
    output: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        output.append({"type": "reasoning", "id": _id("rs"), "summary": [],
                       "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}]})
    if message.get("content"):
        output.append({"type": "message", "id": _id("msg"), "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": message["content"], "annotations": []}]})
    for call in message.get("tool_calls") or []:
        output.append({"type": "function_call", "id": _id("fc"), "call_id": call["id"], "status": "completed",
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"]})
    usage = completion["usage"]
    cut = choice["finish_reason"] == "length"
    return {"id": _id("resp"), "object": "response", "created_at": int(time.time()), "model": completion["model"],
            "status": "incomplete" if cut else "completed", "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "instructions": body.get("instructions"), "metadata": body.get("metadata") or {}, "output": output,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": body.get("tools") or [],
            "temperature": body.get("temperature"), "top_p": body.get("top_p"), "text": DEFAULTS["text"],
            "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                      "total_tokens": usage["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


def response_events(reply: Reply, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of a streamed response: created, each output item (added, its deltas, done; a message's text one
    delta per generated token), completed."""
    final = response(reply, body)
    events: list[dict[str, Any]] = []

    def event(kind: str, **fields: Any) -> None:
        events.append({"type": f"response.{kind}", "sequence_number": len(events), **fields})

    event("created", response={**final, "status": "in_progress", "output": []})
    message = reply.completion["choices"][0]["message"]
    deltas = token_deltas(message, reply.pieces) if reply.pieces and not message.get("tool_calls") else None
    for index, item in enumerate(final["output"]):
        at = {"output_index": index, "item_id": item["id"]}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            event("output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []})
            event("content_part.added", **at, content_index=0, part={"type": "output_text", "text": "",
                                                                     "annotations": []})
            for piece in [d["content"] for d, _ in deltas or [] if "content" in d] or [text]:
                event("output_text.delta", **at, content_index=0, delta=piece, logprobs=[])
            event("output_text.done", **at, content_index=0, text=text, logprobs=[])
            event("content_part.done", **at, content_index=0, part=item["content"][0])
        elif item["type"] == "function_call":
            event("output_item.added", output_index=index, item={**item, "status": "in_progress", "arguments": ""})
            event("function_call_arguments.delta", **at, delta=item["arguments"])
            event("function_call_arguments.done", **at, arguments=item["arguments"])
        else:
            event("output_item.added", output_index=index, item=item)
        event("output_item.done", output_index=index, item=item)
    event("completed", response=final)
    return events


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"
