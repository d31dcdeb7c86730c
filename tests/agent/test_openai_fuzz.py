"""The OpenAI endpoint against bad clients, over raw sockets during a real rollout: malformed, truncated, chunked and
oversized requests, clients that disconnect before or after sending, and one that stalls. Each gets a JSON error or
a closed connection, nothing is logged as an error, no traceback is printed, and the rollout goes on to the right
trajectory."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import urllib.parse

import openai
import pytest

from rlforge import batch as B
from rlforge.hookspecs import hookimpl
from rlforge.plugin_manager import PluginManager
from rlforge.plugins.agent import openai_http
from rlforge.plugins.agent.openai_server import OpenAIAgentLoop
from tests.agent.conftest import Scripted, run_loop

LIMIT = 1 << 20  # the endpoint's body limit in this test (MAX_BODY_BYTES, 16 MiB, patched: less to send)
GOOD = json.dumps({"model": "m", "messages": [{"role": "user", "content": "2+3?"}]}).encode()


def post(path: str, body: bytes, *headers: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in (f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *headers))
    return head.encode() + b"\r\n" + body


def sized(path: str, body: bytes) -> bytes:
    return post(path, body, "Content-Type: application/json", f"Content-Length: {len(body)}")


def chunked(path: str, body: bytes, size: int = 7) -> bytes:
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size]) for i in range(0, len(body), size))
    return post(path, chunks + b"0\r\n\r\n", "Transfer-Encoding: chunked")


def exchange(address: tuple[str, int], data: bytes, *, hang_up: bool = False) -> tuple[object, object]:
    """Send ``data`` on a fresh connection: (status, the error message or the reply's content), or ("closed", None)
    when the server closed without an answer; with ``hang_up``, close right after sending."""
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(data)
        if hang_up:
            return "hung up", None
        response = http.client.HTTPResponse(sock)
        try:
            response.begin()
        except (http.client.RemoteDisconnected, ConnectionResetError):
            return "closed", None
        body = json.loads(response.read())
        if "error" in body:
            return response.status, body["error"]["message"]
        return response.status, body["choices"][0]["message"]["content"]


def cases(path: str) -> list[tuple[str, bytes, dict]]:
    """(name, bytes to send, options of ``exchange``)."""
    too_big = b"%x\r\n%s\r\n" % (1 << 16, b"x" * (1 << 16))
    return [
        ("chunked body", chunked(path, GOOD), {}),
        ("bad JSON", sized(path, b'{"messages": ['), {}),
        ("not an object", sized(path, b"[1, 2]"), {}),
        ("not UTF-8", sized(path, b'{"messages": "\xff"}'), {}),
        ("nested too deep", sized(path, b"[" * 200_000), {}),
        ("no messages", sized(path, b'{"model": "m"}'), {}),
        ("bad message", sized(path, b'{"messages": [{"role": "robot", "content": 1}]}'), {}),
        ("bad content part", sized(path, json.dumps({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "x"}}]}]}).encode()), {}),
        ("garbage request line", b"GARBAGE\r\n\r\n", {}),
        ("two lengths", post(path, GOOD, f"Content-Length: {len(GOOD)}", "Content-Length: 3"), {}),
        ("huge headers", post(path, b"", "X-Big: " + "a" * 100_000), {}),
        ("huge length", post(path, b"", "Content-Length: 1000000000"), {}),
        ("huge chunked body", post(path, too_big * 17 + b"0\r\n\r\n", "Transfer-Encoding: chunked"), {}),  # 1.06 MiB
        ("wrong method", post(path, b"", "Content-Length: 0").replace(b"POST", b"PUT", 1), {}),
        ("unknown path", sized("/v2/nothing", GOOD), {}),
        ("unknown trajectory", sized("/t/0000/v1/chat/completions", GOOD), {}),
        ("cut in the headers", post(path, b"")[:30], {"hang_up": True}),
        ("cut in the body", sized(path, b"x" * 5000)[:-4986], {"hang_up": True}),
        ("gone after a full request", sized(path, GOOD), {"hang_up": True}),
        ("gone after a streamed request", sized(path, json.dumps({"messages": [{"role": "user", "content": "2+3?"}],
                                                                  "stream": True}).encode()), {"hang_up": True}),
    ]


EXPECTED = {
    "chunked body": (200, "5"),
    "bad JSON": (400, "the body is not a JSON object: JSONDecodeError: Expecting value: line 1 column 15 (char 14)"),
    "not an object": (400, "the body must be a JSON object with 'messages', got list"),
    "not UTF-8": (400, "the body is not a JSON object: UnicodeDecodeError"),
    "nested too deep": (400, "the body is not a JSON object: RecursionError"),
    "no messages": (400, "the request needs 'messages', a non-empty list of chat messages"),
    "bad message": (400, "messages[0].role='robot': expected one of system, developer, user, assistant, tool"),
    "bad content part": (400, "messages[0].content[0]: only text parts {'type': 'text', 'text': ...} are supported"),
    "garbage request line": (400, "malformed HTTP request: illegal request line"),
    "two lengths": (400, "malformed HTTP request: conflicting Content-Length headers"),
    "huge headers": (431, "malformed HTTP request"),
    "huge length": (413, "the request body is 1000000000 bytes or more, over the endpoint's limit"),
    "huge chunked body": (413, "the request body is "),  # the bytes read when it went over: checked below
    "wrong method": (405, "PUT is not allowed"),
    "unknown path": (404, "unknown path '/v2/nothing'"),
    "unknown trajectory": (404, "unknown or finished trajectory"),
}
STALLED: list[socket.socket] = []  # a client that sent half a request and waits: the rollout's end closes it


class Fuzzer(OpenAIAgentLoop):
    seen: dict = {}

    def agent(self, sample, endpoint):
        url = urllib.parse.urlsplit(endpoint.base_url)
        address = (url.hostname, url.port)
        path = f"{url.path}/chat/completions"
        for name, data, options in cases(path):
            Fuzzer.seen[name] = exchange(address, data, **options)
        stalled = socket.create_connection(address, timeout=10)
        stalled.sendall(sized(path, GOOD)[:-5])
        STALLED.append(stalled)
        # one connection, an error, then a good request on it: errors that read the whole body keep the connection
        connection = http.client.HTTPConnection(*address, timeout=10)
        connection.request("POST", path, b"{oops", {"Content-Type": "application/json"})
        first = connection.getresponse()
        first.read()
        connection.request("GET", f"{url.path}/models")
        second = connection.getresponse()
        Fuzzer.seen["kept alive"] = (first.status, first.will_close, second.status, json.loads(second.read()))
        api = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
        return api.chat.completions.create(model=endpoint.model, messages=sample.messages).choices[0].message.content


class Plugin:
    @hookimpl
    def rlforge_register(self, registry):
        registry.agent_loop.register("fuzzer", Fuzzer)


@pytest.fixture(scope="module")
def agent_pm():
    pm = PluginManager(autoload=False)
    pm.register(Plugin(), name="openai_fuzz_agents")
    return pm


def test_bad_clients_get_an_error_or_a_closed_connection_and_the_rollout_goes_on(agent_pm, tok, caplog, capfd,
                                                                               monkeypatch):
    monkeypatch.setattr(openai_http, "MAX_BODY_BYTES", LIMIT)
    Fuzzer.seen.clear()
    engine = Scripted(tok, lambda _: "5")
    with caplog.at_level(logging.WARNING):
        out, metrics = run_loop(agent_pm, tok, "fuzzer", engine)
    seen = Fuzzer.seen
    assert {name: (seen[name][0], seen[name][1][:len(said)]) for name, (_, said) in EXPECTED.items()} == EXPECTED
    assert seen["huge chunked body"][1].endswith(f"bytes or more, over the endpoint's limit of {LIMIT} bytes")
    for name in ("cut in the headers", "cut in the body", "gone after a full request", "gone after a streamed request"):
        assert seen[name] == ("hung up", None)
    assert seen["kept alive"][:3] == (400, False, 200) and seen["kept alive"][3]["data"][0]["id"] == "rlforge-policy"
    # the rollout went on: the agent's last request is the trajectory (the chunked request and those of the clients
    # that left after sending were served, and restarted it)
    assert out[B.SOLUTION_TEXT] == ["5"] and out[B.RESPONSE_MASK].tolist() == [[1, 1]]
    assert metrics["agent/restarts/mean"] == 3 and len(engine.params) == 4
    assert STALLED.pop().recv(1) == b""  # closed when the rollout ended
    assert [r.getMessage() for r in caplog.records] == []
    assert "Traceback" not in capfd.readouterr().err
