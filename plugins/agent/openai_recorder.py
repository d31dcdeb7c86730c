"""One trajectory's conversation as the ``openai_agent`` endpoint sees it, and the replies it sends (a chat
completion, or its chunks for ``stream=true``).

The endpoint keeps the conversation as tokens: a request that continues the previous request and its reply adds its
new messages (tool results, user turns) as inserted tokens after the recorded model tokens. A request that does not
starts the trajectory over from its own messages (``restarts``). An assistant message the agent sends back must be
the reply it got (the same text, the same tool calls by name and arguments): one that differs was edited, so it is
not what the model generated, and the request starts the trajectory over with the edited message in the prompt
(``edited_turns``). The model is thus trained only on tokens it generated, after the context the agent sent.

A request of ``OFF_LOOP_BYTES`` or more is decoded, checked and tokenized on a worker thread (:func:`off_loop`): on the
rollout's event loop, a 2 MB body stalled every other agent's requests meanwhile. Smaller ones stay on the loop, where
they take less time than the hop to a thread.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from rlforge.agent import Conversation, Sample, TrajectoryEngine
from rlforge.errors import RLForgeError
from rlforge.plugins.agent.openai_request import ChatRequest, RequestError, parse_request

MODEL = "rlforge-policy"
REJECTED = (RequestError, RLForgeError, ValueError)  # answered with HTTP 400, e.g. a prompt over max_prompt_length
OFF_LOOP_BYTES = 64 << 10  # a request body this large is parsed and tokenized off the event loop (off_loop)
R = TypeVar("R")


async def off_loop(offload: bool, fn: Callable[..., R], *args: Any) -> R:
    """``fn(*args)``: on a worker thread when ``offload`` (a large request, whose parsing and tokenizing would stall
    the other trajectories' requests on the event loop), else here."""
    return await asyncio.to_thread(fn, *args) if offload else fn(*args)


class Recorder:
    """One trajectory's conversation; its methods run on the rollout's event loop."""

    def __init__(self, context: Any, sample: Sample, engine: TrajectoryEngine) -> None:
        self.context, self.sample, self.engine = context, sample, engine
        self.conv: Conversation | None = None
        self.seen: list[dict[str, Any]] = []  # the last request's messages and the reply it got
        self.restarts = 0
        self.edited_turns = 0  # restarts because an assistant message differed from the model's reply
        self.rejected = 0  # requests answered with HTTP 400
        self.first_rejection = ""
        self.lock = asyncio.Lock()  # one request of a trajectory at a time

    async def complete(self, body: Any, translate: Callable[[Any], Any] | None = None, offload: bool = False
                       ) -> tuple[ChatRequest, Reply]:
        """The checked request and its reply; a ``REJECTED`` error (HTTP 400) changes nothing. ``translate``: turns
        the body of another API (Responses) into a chat-completions body first; ``offload``: check and tokenize it
        on a worker thread (a large request, :func:`off_loop`)."""
        try:
            request = await off_loop(offload, self._parse, body, translate)
            async with self.lock:
                return request, await self._complete(request, offload)
        except REJECTED as exc:
            self.rejected += 1
            self.first_rejection = self.first_rejection or str(exc)
            raise

    def _parse(self, body: Any, translate: Callable[[Any], Any] | None) -> ChatRequest:
        return parse_request(translate(body) if translate is not None else body, self.engine.defaults)

    async def _complete(self, request: ChatRequest, offload: bool) -> Reply:
        messages = request.messages
        conv, restart, edited = await off_loop(offload, self._conversation, request)
        text = await conv.generate(self.engine, max_new_tokens=request.max_tokens)
        self.conv = conv
        self.restarts += int(restart)
        self.edited_turns += int(edited)
        gen = conv.last if text is not None else None  # None: a limit ended the trajectory
        message, finish = self._reply(text or "", gen, bool(request.tools))
        self.seen = [*messages, _as_sent_back(message)]
        pieces = token_texts(self.context.chat, gen.ids) if request.stream and gen is not None else []
        return Reply(self._completion(message, finish, gen, request.logprobs), pieces)

    def _conversation(self, request: ChatRequest) -> tuple[Conversation, bool, bool]:
        """(the conversation the request's turn goes on, whether it starts the trajectory over, whether because an
        assistant message was edited), its new messages tokenized. Everything that can reject the request (HTTP 400)
        runs before the recorded conversation changes."""
        messages = request.messages
        if self.conv is not None and len(messages) > len(self.seen) and _continues(messages, self.seen):
            if self.conv.stop_reason is None:  # raises before it inserts anything
                self.conv.add_messages([self._cut(m) for m in messages[len(self.seen):]])
            return self.conv, False, False
        conv = Conversation(self.context, self.sample, tools=request.tools or False,
                            opening=[self._cut(m) for m in messages])
        restart = self.conv is not None
        return conv, restart, restart and _edited(messages, self.seen)

    def _cut(self, message: dict[str, Any]) -> dict[str, Any]:
        """A tool message's text cut to ``rollout.agent.max_tool_output_tokens``, as ``tool_agent`` cuts a tool's
        reply (the agent's own copy of the conversation keeps it whole)."""
        if message.get("role") != "tool" or not isinstance(message.get("content"), str):
            return message
        limits = self.context.config.rollout.agent
        text, _ = self.context.chat.truncate(message["content"], limits.max_tool_output_tokens,
                                             limits.tool_output_truncate_side)
        return {**message, "content": text}

    def _reply(self, text: str, gen: Any, with_tools: bool) -> tuple[dict[str, Any], str]:
        """The assistant message of a model turn: its tool calls (when the request offered tools and every call of
        the turn could be read), its reasoning as ``reasoning_content`` (when the parser found some), else the text
        as the model wrote it."""
        finish = gen.finish if gen is not None else "length"
        if gen is None:
            return {"role": "assistant", "content": text}, finish
        parsed = self.context.parser.parse(text)
        reasoning = {"reasoning_content": parsed.reasoning} if parsed.reasoning else {}
        if with_tools and self.conv is not None:  # the trajectory's tool metrics, as tool_agent counts them
            self.conv.stats.parse_errors += len(parsed.errors)
        if not with_tools or not parsed.calls or parsed.errors:
            plain = parsed.content if reasoning and not parsed.calls and not parsed.errors else text
            return {"role": "assistant", "content": plain, **reasoning}, finish
        if self.conv is not None:
            self.conv.stats.calls += len(parsed.calls)
        calls = [{"id": c.id, "type": "function",
                  "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                 for c in parsed.calls]
        return {"role": "assistant", "content": parsed.content or None, **reasoning, "tool_calls": calls}, "tool_calls"

    def _completion(self, message: dict[str, Any], finish: str, gen: Any, logprobs: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        if logprobs and gen is not None:
            tok = self.context.tokenizer
            choice["logprobs"] = {"content": [{"token": tok.decode([t]), "logprob": lp, "bytes": None,
                                               "top_logprobs": []} for t, lp in zip(gen.ids, gen.log_probs)]}
        assert self.conv is not None
        completion = len(gen.ids) if gen is not None else 0
        prompt = len(self.conv.prompt_ids) + len(self.conv.response_ids) - completion
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
                "model": MODEL, "choices": [choice],
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                          "total_tokens": prompt + completion}}


@dataclass(frozen=True)
class Reply:
    """A chat completion, and for ``stream=true`` each generated token's share of the turn's text."""

    completion: dict[str, Any]
    pieces: list[str]


def token_texts(chat: Any, ids: list[int]) -> list[str]:
    """Each token's share of ``chat.decode(ids)`` (their concatenation), read incrementally: a token that ends inside
    a character (a byte-level BPE piece of a UTF-8 sequence) adds nothing until the character is complete. When the
    shares do not add up to the text (a tokenizer whose decoding of a window differs), the whole text is one share."""
    pieces: list[str] = []
    start = read = 0  # the window decoded for context, and where its unread part begins
    for k in range(len(ids)):
        before = chat.decode(ids[start:read])
        now = chat.decode(ids[start:k + 1])
        if len(now) > len(before) and not now.endswith("\ufffd") and now.startswith(before):
            pieces.append(now[len(before):])
            start, read = read, k + 1
        else:
            pieces.append("")
    text = chat.decode(ids)
    done = "".join(pieces)
    if text.startswith(done) and len(text) > len(done) and pieces:
        pieces[-1] += text[len(done):]
    return pieces if "".join(pieces) == text else [text]


def stream_chunks(reply: Reply, include_usage: bool) -> list[dict[str, Any]]:
    """A chat completion as OpenAI's ``chat.completion.chunk`` objects: the role, then one chunk per generated token
    with its share of the ``reasoning_content`` and the ``content`` (and its log-prob), the tool calls, the finish
    reason, and with ``include_usage`` a last chunk with the token counts. A turn whose content is not the model's
    text token for token (a tool-call turn's content without its calls) has its fields in one chunk each. The turn is
    generated whole (in a wave), so the chunks follow each other at once."""
    completion = reply.completion
    choice = completion["choices"][0]
    message = choice["message"]
    head = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"]}
    usage = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None, entries: list[Any] | None = None) -> dict[str, Any]:
        logprobs = {"content": entries} if entries else None
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}],
                **usage}

    entries = (choice["logprobs"] or {}).get("content") or []
    deltas = token_deltas(message, reply.pieces) if len(entries) in (0, len(reply.pieces)) else None
    if deltas is None:  # the fields whole, the log-probs with the first of them
        deltas = [({k: message[k]}, list(range(len(entries))) if i == 0 else [])
                  for i, k in enumerate(k for k in ("reasoning_content", "content") if message.get(k))]
    chunks = [chunk({"role": "assistant", "content": ""})]
    used = 0
    for delta, tokens in deltas:
        chunks.append(chunk(delta, entries=[entries[t] for t in tokens if t < len(entries)]))
        used = max([used, *(t + 1 for t in tokens)])
    if message.get("tool_calls"):
        chunks.append(chunk({"tool_calls": [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]}))
    chunks.append(chunk({}, choice["finish_reason"], entries[used:]))
    if include_usage:
        chunks.append({**head, "choices": [], "usage": completion["usage"]})
    return chunks


def token_deltas(message: dict[str, Any], pieces: list[str]) -> list[tuple[dict[str, str], list[int]]] | None:
    """``(delta, the tokens it carries)`` per chunk: each token's share of the text, cut to the parts of it that are
    the message's ``reasoning_content`` and ``content`` (markers such as ``<think>`` are in neither); a token that
    adds to neither goes with the next chunk. None when those fields are not parts of the text, in order."""
    text = "".join(pieces)
    fields, pos = [], 0
    for key in ("reasoning_content", "content"):
        value = message.get(key) or ""
        if value:
            at = text.find(value, pos)
            if at < 0:
                return None
            fields.append((key, at, at + len(value)))
            pos = at + len(value)
    out: list[tuple[dict[str, str], list[int]]] = []
    waiting: list[int] = []
    offset = 0
    for t, piece in enumerate(pieces):
        lo, hi = offset, offset + len(piece)
        offset = hi
        waiting.append(t)
        delta = {key: text[max(lo, a):min(hi, b)] for key, a, b in fields if max(lo, a) < min(hi, b)}
        if delta:
            out.append((delta, waiting))
            waiting = []
    return out


def _as_sent_back(reply: dict[str, Any]) -> dict[str, Any]:
    """The reply as a checked request carries it back: content as a string, tool-call arguments decoded."""
    out = {**reply, "content": reply.get("content") or ""}
    if "tool_calls" in reply:
        out["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                             for c in reply["tool_calls"]]
    return out


def _calls(message: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]


def _same(sent: dict[str, Any], seen: dict[str, Any]) -> bool:
    """Whether a message of the request is the one recorded at its place (an assistant one: the model's reply)."""
    if sent.get("role") != seen.get("role") or sent.get("content") != seen.get("content"):
        return False
    return sent.get("role") != "assistant" or _calls(sent) == _calls(seen)


def _continues(messages: list[dict[str, Any]], seen: list[dict[str, Any]]) -> bool:
    return all(_same(a, b) for a, b in zip(messages, seen))


def _edited(messages: list[dict[str, Any]], seen: list[dict[str, Any]]) -> bool:
    """The request continues the recorded conversation except for assistant messages that differ from it."""
    pairs = list(zip(messages, seen))
    return (len(messages) > len(seen) and all(a.get("role") == b.get("role") for a, b in pairs)
            and all(_same(a, b) for a, b in pairs if a.get("role") != "assistant")
            and not all(_same(a, b) for a, b in pairs))
