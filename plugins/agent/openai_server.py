"""``openai_agent``: agents written against the OpenAI chat-completions API generate trajectories unchanged.

During each rollout an OpenAI-compatible endpoint on 127.0.0.1 serves the rollout engine: an asyncio HTTP/1.1 server
(``openai_http``) in the rollout's own event loop, started when the rollout begins and closed when it ends. Each
trajectory gets its own base URL (``http://127.0.0.1:PORT/t/<id>/v1``); the agent function (or an
:class:`OpenAIAgentLoop` subclass) talks to it with any client, e.g. ``openai.OpenAI(base_url=...)``, tool calls and
``stream=true`` included, and OpenAI's Responses API (``POST <base_url>/responses``, the Agents SDK's default,
``openai_responses``). Requests are checked field by field (``openai_request``: a 400 names every unsupported
field); the conversation is kept as tokens (``openai_recorder``). ``GET <base_url>/models`` lists the one model.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlforge.agent import AgentLoop, Sample, Trajectory, TrajectoryEngine
from rlforge.agent.base import maybe_await
from rlforge.agent.workers import DaemonThreads
from rlforge.errors import ConfigError, RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.plugin_manager import import_file
from rlforge.plugins.agent import openai_responses as responses
from rlforge.plugins.agent.openai_http import HttpRequest, HttpResponse, HttpServer, error_payload
from rlforge.plugins.agent.openai_recorder import (MODEL, OFF_LOOP_BYTES, REJECTED, Recorder, Reply, off_loop,
                                                   stream_chunks)
from rlforge.plugins.agent.openai_request import ChatRequest

_LOADING = threading.Lock()  # the entry function's first load (OpenAIAgent.agent)
AGENT_THREADS = 256  # daemon threads that run synchronous agent functions (each waits on its HTTP calls)


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
        self.server: ChatServer | None = None  # set while a rollout runs
        self._fn: Any = None  # the entry function, loaded on first use
        self._threads: DaemonThreads | None = None

    def agent(self, sample: Sample, endpoint: Endpoint) -> Any:
        """The agent: by default the function named by ``rollout.agent.openai_agent.entry``."""
        if self._fn is None:
            with _LOADING:  # the first trajectories start together: the entry is loaded by one of them
                if self._fn is None:
                    self._fn = load_entry(self.config.rollout.agent.openai_agent.entry)
        return self._fn(sample, endpoint)

    @contextlib.asynccontextmanager
    async def rollout_scope(self) -> AsyncIterator[None]:
        """The endpoint, serving in the rollout's event loop while its trajectories run."""
        server = ChatServer()
        await server.start()
        self.server = server
        try:
            yield
        finally:
            self.server = None
            await server.close()

    async def run(self, sample: Sample, engine: TrajectoryEngine) -> Trajectory:
        if self.server is None:
            raise RLForgeError("OpenAIAgentLoop.run needs the endpoint of AgentLoop.rollout_scope(), which the agentic "
                               "rollout runs it in")
        recorder = Recorder(self.context, sample, engine)
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
        return recorder.conv.finish(answer, reward, {**metrics, "restarts": float(recorder.restarts),
                                                     "edited_turns": float(recorder.edited_turns)})

    async def _call_agent(self, sample: Sample, endpoint: Endpoint) -> Any:
        if asyncio.iscoroutinefunction(self.agent):
            return await self.agent(sample, endpoint)
        if self._threads is None:
            self._threads = DaemonThreads(AGENT_THREADS, "rlforge-openai-agent")
        result = await asyncio.wrap_future(self._threads.submit(self.agent, sample, endpoint))
        return await maybe_await(result)

    def close(self) -> None:
        if self._threads is not None:
            self._threads.close()
            self._threads = None


class ChatServer:
    """The endpoint's routes: ``POST /t/<trajectory>/v1/chat/completions`` (and ``.../v1/responses``, translated:
    ``openai_responses``) goes to that trajectory's :class:`Recorder`; ``GET .../models``."""

    def __init__(self) -> None:
        self.recorders: dict[str, Recorder] = {}
        self.http = HttpServer(self.route)

    @property
    def url(self) -> str:
        return self.http.url

    async def start(self) -> None:
        await self.http.start()

    async def close(self) -> None:
        await self.http.close()

    def add(self, recorder: Recorder) -> str:
        key = uuid.uuid4().hex
        self.recorders[key] = recorder
        return key

    def remove(self, key: str) -> None:
        self.recorders.pop(key, None)

    async def route(self, request: HttpRequest) -> HttpResponse:
        parts = request.path.split("?", 1)[0].strip("/").split("/")
        if request.method == "GET":
            return self.models(parts, request.path)
        if request.method != "POST":
            return HttpResponse(405, error_payload(f"{request.method} is not allowed: POST <base_url>/chat/completions "
                                                   "or GET <base_url>/models", "invalid_request_error"))
        api = APIS.get(tuple(parts[3:])) if len(parts) >= 4 and parts[0] == "t" and parts[2] == "v1" else None
        if api is None:
            return HttpResponse(404, error_payload(f"unknown path {request.path!r:.200}; use "
                                                   "<base_url>/chat/completions or <base_url>/responses", "not_found"))
        recorder = self.recorders.get(parts[1])
        if recorder is None:
            return HttpResponse(404, error_payload("unknown or finished trajectory", "not_found"))
        offload = len(request.body) >= OFF_LOOP_BYTES  # parsed and tokenized on a worker thread
        try:
            body = await off_loop(offload, json.loads, request.body)
        except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, or nested past the decoder's limit
            return HttpResponse(400, error_payload(f"the body is not a JSON object: {type(exc).__name__}: {exc}"))
        try:
            chat, reply = await recorder.complete(body, api.translate, offload)
        except REJECTED as exc:
            return HttpResponse(400, error_payload(str(exc), param=getattr(exc, "param", None),
                                                   code=getattr(exc, "code", None)))
        except Exception as exc:  # the engine or the template failed: the agent sees it, the run reports it
            return HttpResponse(500, error_payload(f"{type(exc).__name__}: {exc}", "server_error"))
        return api.answer(chat, reply, body)

    @staticmethod
    def models(parts: list[str], path: str) -> HttpResponse:
        """``GET <base_url>/models`` (and ``/models/<model>``): the one model the endpoint serves."""
        if parts[:1] == ["t"] and len(parts) >= 2:  # <base_url> is /t/<trajectory>/v1
            parts = parts[2:]
        model = {"id": MODEL, "object": "model", "created": 0, "owned_by": "rlforge"}
        if parts == ["v1", "models"]:
            return HttpResponse(200, {"object": "list", "data": [model]})
        if parts == ["v1", "models", MODEL]:
            return HttpResponse(200, model)
        return HttpResponse(404, error_payload(f"unknown path {path!r:.200}; use <base_url>/models or POST "
                                               "<base_url>/chat/completions", "not_found"))


@dataclass(frozen=True)
class Api:
    """A POST route: how its request becomes a chat-completions one (None: it is one), and its answer."""

    translate: Callable[[Any], Any] | None
    answer: Callable[[ChatRequest, Reply, Any], HttpResponse]


def _chat_answer(chat: ChatRequest, reply: Reply, body: Any) -> HttpResponse:
    if chat.stream:
        return HttpResponse(200, events=stream_chunks(reply, chat.include_usage))
    return HttpResponse(200, reply.completion)


def _responses_answer(chat: ChatRequest, reply: Reply, body: Any) -> HttpResponse:
    if chat.stream:
        return HttpResponse(200, events=responses.response_events(reply, body))
    return HttpResponse(200, responses.response(reply, body))


APIS = {("chat", "completions"): Api(None, _chat_answer), ("responses",): Api(responses.chat_body, _responses_answer)}


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
        if target.endswith(".py"):  # one module per process, as an import gives (its globals shared by every call)
            if not Path(target).is_file():
                raise FileNotFoundError(target)
            module = import_file(f"rlforge_openai_agent_{Path(target).stem}", Path(target).resolve())
        else:
            module = importlib.import_module(target)
    except Exception as exc:
        raise ConfigError(f"rollout.agent.openai_agent.entry={entry!r}: cannot load '{target}': "
                          f"{type(exc).__name__}: {exc}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"rollout.agent.openai_agent.entry={entry!r}: '{target}' has no function '{name}'.")
    return fn


@hookimpl
def rlforge_register(registry: Any) -> None:
    registry.agent_loop.register("openai_agent", OpenAIAgentLoop, config=OpenAIAgentConfig)
