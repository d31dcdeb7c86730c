"""The HTTP/1.1 server of the ``openai_agent`` endpoint: asyncio streams in the rollout's event loop, ``h11`` for the
protocol.

Connections stay open between requests (keep-alive); a request body comes with a ``Content-Length`` or chunked,
at most ``MAX_BODY_BYTES``; a reply is one JSON body or, for ``stream=true``, server-sent events. Whatever a client
sends, the server never raises: a malformed request (bad request line or headers, conflicting lengths, a header
block over ``MAX_HEADER_BYTES``) gets a JSON 400 (431 for the headers, 413 for the body) and the connection is
closed; a request cut off mid-way, or a client gone before its reply, only closes that connection. Other
connections and the rollout go on.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import h11

log = logging.getLogger("rlforge.agent")
MAX_BODY_BYTES = 16 << 20  # largest request body
MAX_HEADER_BYTES = 64 << 10  # largest request line + headers
BACKLOG = 4096  # pending connections: many agents connect at once (the kernel caps it at net.core.somaxconn)
READ_BYTES = 1 << 14  # below MAX_HEADER_BYTES: h11 checks the size of a header block while it is incomplete
LINGER_S = 1.0  # after refusing a request mid-body: how long its remaining bytes are read and dropped


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    body: bytes


@dataclass(frozen=True)
class HttpResponse:
    """A JSON reply (``payload``) or, with ``events``, a ``text/event-stream`` of ``data:`` lines (each event a JSON
    object, then ``[DONE]``)."""

    status: int
    payload: dict[str, Any] | None = None
    events: list[dict[str, Any]] | None = None


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]
REASONS = {400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed", 413: b"Payload Too Large",
           431: b"Request Header Fields Too Large", 500: b"Internal Server Error"}


def error_payload(message: str, kind: str = "invalid_request_error", param: str | None = None,
                  code: str | None = None) -> dict[str, Any]:
    """OpenAI's error body (the ``openai`` client raises ``BadRequestError`` etc. with it)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class _Refused(Exception):
    """The request cannot be read to its end: answer ``response`` and close the connection."""

    def __init__(self, response: HttpResponse) -> None:
        super().__init__(response.status)
        self.response = response


class HttpServer:
    """Serves ``handler`` on ``host`` (a free port) in the running event loop: ``await start()``, ``await close()``."""

    def __init__(self, handler: Handler, host: str = "127.0.0.1") -> None:
        self.handler, self.host = handler, host
        self.server: asyncio.Server | None = None
        self.url = ""
        self._connections: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, self.host, 0, backlog=BACKLOG)
        self.url = f"http://{self.host}:{self.server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        """Stop listening and close every connection (requests still in flight are cancelled)."""
        if self.server is None:
            return
        self.server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self.server.wait_closed()
        self.server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        try:
            while True:
                try:
                    request = await self._read(conn, reader, writer)
                except _Refused as refused:
                    await self._send(conn, writer, refused.response, close=True)
                    await _linger(reader, writer)
                    break
                if request is None:  # the client closed the connection between requests
                    break
                await self._send(conn, writer, await self._answer(request))
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break  # "Connection: close", or an HTTP/1.0 client
                conn.start_next_cycle()
        except (ConnectionError, TimeoutError, h11.ProtocolError, OSError) as exc:  # the client left mid-way
            log.debug("OpenAI endpoint: connection closed: %s: %s", type(exc).__name__, exc)
        except asyncio.CancelledError:  # close(): end normally (asyncio 3.11 would log a cancelled connection task)
            pass
        except Exception as exc:  # a bug of the server: this connection ends, the others go on
            log.warning("OpenAI endpoint: a connection failed: %s: %s", type(exc).__name__, exc)
        finally:
            self._connections.discard(task)
            writer.close()

    async def _answer(self, request: HttpRequest) -> HttpResponse:
        try:
            return await self.handler(request)
        except Exception as exc:  # a bug behind the endpoint: the agent sees it, the server goes on
            log.warning("OpenAI endpoint: %s %s failed: %s: %s", request.method, request.path, type(exc).__name__,
                        exc)
            return HttpResponse(500, error_payload(f"{type(exc).__name__}: {exc}", "server_error"))

    async def _read(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                    ) -> HttpRequest | None:
        """The next request, read to its end; None when the client closed the connection before one."""
        try:
            head = await _event(conn, reader)
            if isinstance(head, h11.ConnectionClosed):
                return None
            assert isinstance(head, h11.Request)
            length = _content_length(head)
            if length is not None and length > MAX_BODY_BYTES:
                raise _Refused(_too_large(length))
            if conn.they_are_waiting_for_100_continue:
                writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
            body = bytearray()
            while not isinstance(event := await _event(conn, reader), h11.EndOfMessage):
                assert isinstance(event, h11.Data)
                body += event.data
                if len(body) > MAX_BODY_BYTES:
                    raise _Refused(_too_large(len(body)))
        except h11.RemoteProtocolError as exc:
            status = exc.error_status_hint if exc.error_status_hint in REASONS else 400
            raise _Refused(HttpResponse(status, error_payload(f"malformed HTTP request: {exc}"))) from None
        return HttpRequest(head.method.decode("ascii", "replace"), head.target.decode("utf-8", "replace"),
                           bytes(body))

    async def _send(self, conn: h11.Connection, writer: asyncio.StreamWriter, response: HttpResponse,
                    close: bool = False) -> None:
        if writer.transport.is_closing():
            return  # the client is gone: nothing to answer
        headers = [("connection", "close")] if close else []
        if response.events is None:
            data = json.dumps(response.payload).encode()
            headers += [("content-type", "application/json"), ("content-length", str(len(data)))]
            chunks = [h11.Data(data=data)]
        else:
            headers += [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
            chunks = [h11.Data(data=f"data: {json.dumps(e)}\n\n".encode()) for e in response.events]
            chunks.append(h11.Data(data=b"data: [DONE]\n\n"))
        reason = REASONS.get(response.status, b"OK" if response.status == 200 else b"")
        writer.write(conn.send(h11.Response(status_code=response.status, headers=headers, reason=reason)))
        for chunk in chunks:
            writer.write(conn.send(chunk))
            await writer.drain()
            if writer.transport.is_closing():
                return
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After an answer to a request whose body was not read: end our side, and read what the client still sends
    (at most ``LINGER_S`` seconds, ``MAX_BODY_BYTES``) so that closing does not reset the connection before the
    client has read the answer."""
    if writer.can_write_eof():
        writer.write_eof()
    deadline = asyncio.get_running_loop().time() + LINGER_S
    left = MAX_BODY_BYTES
    while left > 0 and (remaining := deadline - asyncio.get_running_loop().time()) > 0:
        try:
            data = await asyncio.wait_for(reader.read(READ_BYTES), remaining)
        except asyncio.TimeoutError:
            return
        if not data:
            return
        left -= len(data)


async def _event(conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
    while (event := conn.next_event()) is h11.NEED_DATA:
        conn.receive_data(await reader.read(READ_BYTES))  # b"" at EOF: h11 then closes or raises
    return event


def _content_length(request: h11.Request) -> int | None:
    for name, value in request.headers:
        if name == b"content-length":
            return int(value)  # h11 checked that it is one decimal number
    return None


def _too_large(size: int) -> HttpResponse:
    return HttpResponse(413, error_payload(f"the request body is {size} bytes or more, over the endpoint's limit of "
                                           f"{MAX_BODY_BYTES} bytes", code="request_too_large"))
