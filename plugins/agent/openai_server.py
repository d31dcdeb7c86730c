"""``openai_agent``: agents written against the OpenAI chat-completions API generate trajectories unchanged.

During the rollout an OpenAI-compatible endpoint on 127.0.0.1 (stdlib ``http.server``) serves the rollout engine.
Each trajectory gets its own base URL (``http://127.0.0.1:PORT/t/<id>/v1``); the agent function (or an
:class:`OpenAIAgentLoop` subclass) talks to it with any client, e.g. ``openai.OpenAI(base_url=...)``, tool calls
included. The endpoint keeps the conversation as tokens: each request's new messages (tool results, user turns)
become inserted tokens after the recorded model tokens and their log-probs, so training needs no re-tokenization.

One conversation per trajectory: a request whose messages do not extend the previous request's messages and the
reply starts the trajectory over (counted in ``agent/restarts/mean``). Not supported: ``stream``, ``n`` > 1, ``stop``.
A rejected request (HTTP 400) changes nothing. ``GET <base_url>/models`` lists the one model.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import math
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rlforge.agent import AgentLoop, Conversation, Sample, Trajectory, TrajectoryEngine
from rlforge.agent.base import maybe_await
from rlforge.errors import ConfigError, RLForgeError
from rlforge.hookspecs import hookimpl

AGENT_THREADS = 256  # threads that run synchronous agent functions (each waits on its HTTP calls)
MODEL = "rlforge-policy"


@dataclass
class OpenAIAgentConfig:
    """The ``openai_agent`` loop (``rollout.agent.openai_agent``)."""

    entry: str = ""  # the agent function, module:function or path/to/file.py:function; called as fn(sample, endpoint)


@dataclass(frozen=True)
class Endpoint:
    """Where one trajectory's agent sends its requests: ``openai.OpenAI(base_url=..., api_key=...)``, ``model``."""

    base_url: str
    api_key: str = "rlforge"
    model: str = MODEL


class RequestError(Exception):
    """A request the endpoint cannot serve (HTTP 400 with an OpenAI-style error body)."""


REJECTED = (RequestError, RLForgeError, ValueError)  # answered with HTTP 400, e.g. a prompt over max_prompt_length


class OpenAIAgentLoop(AgentLoop):
    """Runs an OpenAI-client agent per trajectory. Override :meth:`agent` (sync or async), or set
    ``rollout.agent.openai_agent.entry`` to a function ``fn(sample, endpoint)``. It returns the final answer (a str,
    scored by the reward function), None (the last model turn is the answer) or a dict with ``answer``, ``reward``
    and ``metrics``."""

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        AgentLoop.validate_config(config, registry)
        entry = config.rollout.agent.openai_agent.entry
        if config.rollout.agent.loop == "openai_agent" and not entry:
            raise ConfigError("rollout.agent.loop=openai_agent needs 'rollout.agent.openai_agent.entry', the agent "
                              "function: module:function or path/to/file.py:function, called as fn(sample, endpoint).")

    def __init__(self, config: Any, context: Any) -> None:
        super().__init__(config, context)
        self.server: ChatServer | None = None
        self._fn: Any = None  # the entry function, loaded on first use
        self._threads: ThreadPoolExecutor | None = None

    def agent(self, sample: Sample, endpoint: Endpoint) -> Any:
        """The agent: by default the function named by ``rollout.agent.openai_agent.entry``."""
        if self._fn is None:
            self._fn = load_entry(self.config.rollout.agent.openai_agent.entry)
        return self._fn(sample, endpoint)

    async def run(self, sample: Sample, engine: TrajectoryEngine) -> Trajectory:
        if self.server is None:
            self.server = ChatServer()
        recorder = Recorder(self.context, sample, engine, asyncio.get_running_loop())
        key = self.server.add(recorder)
        try:
            result = await self._call_agent(sample, Endpoint(f"{self.server.url}/t/{key}/v1"))
        finally:
            self.server.remove(key)
        answer, reward, metrics = _unpack(result)
        if recorder.conv is None and recorder.rejected:
            raise RLForgeError(f"the agent returned without a successful chat-completions request "
                               f"({recorder.rejected} rejected: {recorder.first_rejection})")
        if recorder.conv is None:
            raise RLForgeError("the agent returned without sending a chat-completions request")
        return recorder.conv.finish(answer, reward, {**metrics, "restarts": float(recorder.restarts)})

    async def _call_agent(self, sample: Sample, endpoint: Endpoint) -> Any:
        if asyncio.iscoroutinefunction(self.agent):
            return await self.agent(sample, endpoint)
        if self._threads is None:
            self._threads = ThreadPoolExecutor(AGENT_THREADS, thread_name_prefix="rlforge-openai-agent")
        result = await asyncio.get_running_loop().run_in_executor(self._threads, self.agent, sample, endpoint)
        return await maybe_await(result)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        if self._threads is not None:
            self._threads.shutdown(wait=False)
            self._threads = None


class Recorder:
    """One trajectory's conversation as the endpoint sees it; its methods run on the rollout's event loop."""

    def __init__(self, context: Any, sample: Sample, engine: TrajectoryEngine, loop: asyncio.AbstractEventLoop):
        self.context, self.sample, self.engine, self.loop = context, sample, engine, loop
        self.conv: Conversation | None = None
        self.seen: list[dict[str, Any]] = []  # the last request's messages and the reply it got
        self.restarts = 0
        self.rejected = 0  # requests answered with HTTP 400
        self.first_rejection = ""
        self.lock = asyncio.Lock()

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self._complete(body)
        except REJECTED as exc:
            self.rejected += 1
            self.first_rejection = self.first_rejection or str(exc)
            raise

    async def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        async with self.lock:
            # Everything that can reject the request (HTTP 400) runs before the recorded conversation changes.
            messages, tools, overrides, limit = _check_request(body)
            if self.conv is not None and _extends(messages, self.seen):
                conv, restart = self.conv, False
                if conv.stop_reason is None:
                    conv.add_messages(messages[len(self.seen):])  # raises before it inserts anything
            else:
                conv = Conversation(self.context, self.sample, tools=tools or False, opening=messages)
                restart = self.conv is not None
            text = await conv.generate(self.engine, max_new_tokens=limit, **overrides)
            self.conv = conv
            self.restarts += int(restart)
            gen = self.conv.last if text is not None else None  # None: a limit ended the trajectory
            message, finish = self._reply(text or "", gen, bool(tools))
            self.seen = [*messages, message]
            return self._response(message, finish, gen, body.get("logprobs"))

    def _reply(self, text: str, gen: Any, with_tools: bool) -> tuple[dict[str, Any], str]:
        parsed = self.context.parser.parse(text) if with_tools and gen is not None else None
        if parsed is not None and self.conv is not None:  # the trajectory's tool metrics, as tool_agent counts them
            self.conv.stats.parse_errors += len(parsed.errors)
        if parsed is None or not parsed.calls or parsed.errors:
            return {"role": "assistant", "content": text}, gen.finish if gen is not None else "length"
        if self.conv is not None:
            self.conv.stats.calls += len(parsed.calls)
        calls = [{"id": c.id, "type": "function",
                  "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                 for c in parsed.calls]
        return {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}, "tool_calls"

    def _response(self, message: dict[str, Any], finish: str, gen: Any, logprobs: Any) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        if logprobs and gen is not None:
            tok = self.context.tokenizer
            choice["logprobs"] = {"content": [{"token": tok.decode([t]), "logprob": lp, "bytes": None,
                                               "top_logprobs": []} for t, lp in zip(gen.ids, gen.log_probs)]}
        completion = len(gen.ids) if gen is not None else 0
        prompt = len(self.conv.prompt_ids) + len(self.conv.response_ids) - completion
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
                "model": MODEL, "choices": [choice],
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                          "total_tokens": prompt + completion}}


def _check_request(body: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, float], int | None]:
    """The request's messages, tools, sampling overrides and token limit; a RequestError (HTTP 400) for a request
    the endpoint cannot serve, before it touches the conversation or joins a wave of engine calls."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        raise RequestError("the request needs 'messages', a non-empty list of chat messages")
    if body.get("stream"):
        raise RequestError("stream=true is not supported by the rlforge endpoint")
    if (body.get("n") or 1) != 1:
        raise RequestError("n > 1 is not supported: send one request per completion")
    if body.get("stop"):
        raise RequestError("'stop' sequences are not supported: the model stops at its end-of-turn token")
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise RequestError("'tools' must be a list of function schemas")
    messages = [_plain(m) for m in body["messages"]]
    overrides, limit = _sampling(body)
    return messages, tools, overrides, limit


def _sampling(body: dict[str, Any]) -> tuple[dict[str, float], int | None]:
    """The sampling values of a request, checked so that one agent's bad value cannot fail the engine call of the
    whole wave: temperature >= 0, 0 < top_p <= 1, max_tokens / max_completion_tokens an integer >= 1."""
    overrides: dict[str, float] = {}
    for key, ok, accepted in (("temperature", lambda v: v >= 0, "a number >= 0"),
                              ("top_p", lambda v: 0 < v <= 1, "a number with 0 < top_p <= 1")):
        value = body.get(key)
        if value is None:
            continue
        if not _finite(value) or not ok(value):
            raise RequestError(f"{key}={value!r} is out of range: {key} must be {accepted}")
        overrides[key] = float(value)
    limits = []
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RequestError(f"{key}={value!r} is out of range: {key} must be an integer >= 1")
        limits.append(value)
    return overrides, limits[0] if limits else None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _plain(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict) or "role" not in message:
        raise RequestError(f"each message needs a 'role', got {message!r:.100}")
    return {k: v for k, v in message.items() if v is not None}


def _extends(messages: list[dict[str, Any]], seen: list[dict[str, Any]]) -> bool:
    """Whether ``messages`` continue the conversation ``seen`` (the reply may come back in another shape)."""
    if not seen or len(messages) <= len(seen):
        return False
    same = [a.get("role") == b.get("role") and (a.get("role") == "assistant" or a.get("content") == b.get("content"))
            for a, b in zip(messages, seen)]
    return all(same)


def _unpack(result: Any) -> tuple[str | None, float, dict[str, float]]:
    if result is None or isinstance(result, str):
        return result, 0.0, {}
    if isinstance(result, dict) and set(result) <= {"answer", "reward", "metrics"}:
        return result.get("answer"), float(result.get("reward", 0.0)), dict(result.get("metrics") or {})
    raise TypeError(f"the agent returned {result!r:.100}; return a str (the answer), None, or a dict with "
                    "'answer', 'reward' and 'metrics'")


def load_entry(entry: str) -> Any:
    """The function ``module:function`` or ``path/to/file.py:function`` (``rollout.agent.openai_agent.entry``)."""
    target, _, name = entry.rpartition(":")
    if not target or not name:
        raise ConfigError(f"rollout.agent.openai_agent.entry={entry!r}: write module:function or file.py:function.")
    try:
        if target.endswith(".py"):
            spec = importlib.util.spec_from_file_location(f"rlforge_openai_agent_{Path(target).stem}", target)
            if spec is None or spec.loader is None or not Path(target).is_file():
                raise FileNotFoundError(target)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except Exception as exc:
        raise ConfigError(f"rollout.agent.openai_agent.entry={entry!r}: cannot load '{target}': "
                          f"{type(exc).__name__}: {exc}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"rollout.agent.openai_agent.entry={entry!r}: '{target}' has no function '{name}'.")
    return fn


class _Server(ThreadingHTTPServer):
    """A thread per request, and a listen backlog for every trajectory in flight: socketserver's default of 5
    resets connections when many agents send at once (the kernel caps it at net.core.somaxconn)."""

    daemon_threads = True
    request_queue_size = 4096


class ChatServer:
    """The HTTP endpoint: ``POST /t/<trajectory>/v1/chat/completions`` goes to that trajectory's :class:`Recorder`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.recorders: dict[str, Recorder] = {}
        self.httpd = _Server((host, port), _handler(self))
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="rlforge-openai-endpoint", daemon=True)
        self.thread.start()

    def add(self, recorder: Recorder) -> str:
        key = uuid.uuid4().hex
        self.recorders[key] = recorder
        return key

    def remove(self, key: str) -> None:
        self.recorders.pop(key, None)

    def models(self, path: str) -> tuple[int, dict[str, Any]]:
        """``GET <base_url>/models`` (and ``/models/<model>``): the one model the endpoint serves."""
        parts = path.split("?", 1)[0].strip("/").split("/")
        if parts[:1] == ["t"] and len(parts) >= 2:  # <base_url> is /t/<trajectory>/v1
            parts = parts[2:]
        model = {"id": MODEL, "object": "model", "created": 0, "owned_by": "rlforge"}
        if parts == ["v1", "models"]:
            return 200, {"object": "list", "data": [model]}
        if parts == ["v1", "models", MODEL]:
            return 200, model
        return 404, _error(f"unknown path {path}; use <base_url>/models or POST <base_url>/chat/completions",
                           "not_found")

    def serve(self, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        parts = path.strip("/").split("/")
        if len(parts) != 5 or parts[0] != "t" or parts[2:] != ["v1", "chat", "completions"]:
            return 404, _error(f"unknown path {path}; use <base_url>/chat/completions", "not_found")
        recorder = self.recorders.get(parts[1])
        if recorder is None:
            return 404, _error("unknown or finished trajectory", "not_found")
        try:
            future = asyncio.run_coroutine_threadsafe(recorder.complete(body), recorder.loop)
            return 200, future.result()
        except REJECTED as exc:
            return 400, _error(str(exc), "invalid_request_error")
        except Exception as exc:  # the engine or the template failed: the agent sees it, the run reports it
            return 500, _error(f"{type(exc).__name__}: {exc}", "server_error")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _handler(server: ChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
            except json.JSONDecodeError as exc:
                status, payload = 400, _error(f"the body is not JSON: {exc}", "invalid_request_error")
            else:
                status, payload = server.serve(self.path, body)
            self._send(status, payload)

        def do_GET(self) -> None:
            self._send(*server.models(self.path))

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # no access log on stderr
            pass

    return Handler


@hookimpl
def rlforge_register(registry: Any) -> None:
    registry.agent_loop.register("openai_agent", OpenAIAgentLoop, config=OpenAIAgentConfig)
