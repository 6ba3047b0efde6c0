"""The API's HTTP/1.1 protocol (llm_platform.lean_http) against a live `llm_platform.server`
serving a probe app (tests/support/asgi_probe.py): keep-alive, pipelining, chunked bodies both
ways, `Expect: 100-continue`, HTTP/1.0, HEAD, WebSocket upgrades handed to daphne's protocol,
disconnects, backpressure, idle connections, malformed input and failing applications.

Raw sockets where a client library would hide what is on the wire. The oversized-head limits
are in test_request_heads.py (against the real app)."""
from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest
from websockets.asyncio.client import connect

from llm_platform.web_processes import single_endpoint
from tests.support.processes import free_port, http_ok, start, wait_until
from tests.support.waiting import wait_until as wait_for

from .conftest import LOG_DIR

pytestmark = [pytest.mark.e2e]

IDLE_SECONDS = 2


@pytest.fixture(scope="module", params=["lean", "daphne"])
def server(request):
    """(protocol, base URL): the probe app behind `llm_platform.server` with that protocol."""
    port = free_port()
    proc = start(f"probe-{request.param}",
                 ["-m", "llm_platform.server", "-e", single_endpoint("127.0.0.1", port),
                  "tests.support.asgi_probe:app"],
                 {"API_HTTP_PROTOCOL": request.param, "API_HTTP_IDLE_SECONDS": str(IDLE_SECONDS)},
                 LOG_DIR)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_ok(url + "/events"), proc, 60, "the probe app")
        yield request.param, url
    finally:
        proc.stop()


@pytest.fixture
def lean(server):
    if server[0] != "lean":
        pytest.skip("what llm_platform.lean_http does beyond Twisted's protocol")
    return server[1]


class Wire:
    """One raw connection: send bytes, read replies off it as they come."""

    def __init__(self, url: str):
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def _take(self, size: int) -> bytes:
        while len(self.buffer) < size:
            if not self._fill():
                raise EOFError(f"closed with {len(self.buffer)} of {size} bytes")
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            if not self._fill():
                raise EOFError("closed inside a line")
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def reply(self, head_request: bool = False) -> tuple[int, dict, bytes]:
        """(status, headers with lowercase names, body) of the next reply (1xx included)."""
        status = int(self._line().split()[1])
        headers = {}
        while line := self._line():
            name, _, value = line.partition(b":")
            headers[name.decode().lower()] = value.strip().decode("latin-1")
        if head_request or status < 200 or status in (204, 304):
            return status, headers, b""
        if "content-length" in headers:
            return status, headers, self._take(int(headers["content-length"]))
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while size := int(self._line(), 16):
                body += self._take(size)
                assert self._take(2) == b"\r\n"
            assert self._line() == b""
            return status, headers, body
        return status, headers, self.rest()

    def rest(self) -> bytes:
        while self._fill():
            pass
        data, self.buffer = self.buffer, b""
        return data

    def closed(self) -> bool:
        """True once the server has closed (EOF; a reset counts too)."""
        try:
            return not self._fill()
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def wire(server):
    connection = Wire(server[1])
    yield connection
    connection.close()


def get(path: str, extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    return b"GET " + path.encode() + b" HTTP/" + version + b"\r\nHost: probe\r\n" + extra + b"\r\n"


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: probe\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


def events(url: str) -> list[str]:
    return httpx.get(url + "/events", timeout=10).json()


def test_keep_alive_serves_several_requests_on_one_connection(wire):
    for size in (0, 10, 5000):
        wire.send(post("/echo", b"x" * size))
        status, headers, body = wire.reply()
        assert status == 200 and json.loads(body)["body_size"] == size
        assert headers.get("connection") != "close"


def test_pipelined_requests_are_answered_in_order(wire):
    wire.send(b"".join(post(f"/echo/{i}", b"b" * i) for i in range(6)))
    for i in range(6):
        status, _, body = wire.reply()
        assert status == 200
        reply = json.loads(body)
        assert (reply["path"], reply["body_size"]) == (f"/echo/{i}", i)


def test_a_chunked_request_body_arrives_whole(wire):
    chunks = [b"a" * 7, b"b" * 4000, b"c"]
    wire.send(b"POST /echo HTTP/1.1\r\nHost: probe\r\nTransfer-Encoding: chunked\r\n\r\n")
    for chunk in chunks:
        wire.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    wire.send(b"0\r\n\r\n")
    status, _, body = wire.reply()
    assert status == 200 and json.loads(body)["body_size"] == sum(map(len, chunks))


def test_expect_100_continue_is_answered_before_the_body(wire):
    wire.send(b"POST /echo HTTP/1.1\r\nHost: probe\r\nExpect: 100-continue\r\n"
              b"Content-Length: 5\r\n\r\n")
    status, _, _ = wire.reply()
    assert status == 100
    wire.send(b"hello")
    status, _, body = wire.reply()
    assert status == 200 and json.loads(body)["body_head"] == "hello"


def test_a_streamed_reply_is_chunked_and_whole(server):
    with httpx.stream("GET", server[1] + "/stream?n=50", timeout=30) as reply:
        assert reply.headers["transfer-encoding"] == "chunked"
        text = b"".join(reply.iter_bytes()).decode()
    assert text == "".join(f"chunk {i}\n" for i in range(50))


def test_http_1_0_gets_its_reply_then_the_connection_closes(wire):
    wire.send(get("/echo", version=b"1.0"))
    status, _, body = wire.reply()
    assert status == 200 and json.loads(body)["http_version"] == "1.0"
    assert wire.closed()


def test_connection_close_is_honoured(wire):
    wire.send(get("/echo", b"Connection: close\r\n"))
    status, headers, _ = wire.reply()
    assert status == 200
    assert wire.closed()


def test_head_gets_the_headers_without_a_body(lean):
    wire = Wire(lean)
    try:
        wire.send(b"HEAD /echo HTTP/1.1\r\nHost: probe\r\n\r\n")
        status, headers, _ = wire.reply(head_request=True)
        assert status == 200 and int(headers["content-length"]) > 0
        wire.send(get("/echo"))  # the connection is still in step: no body was written
        status, _, body = wire.reply()
        assert status == 200 and json.loads(body)["method"] == "GET"
    finally:
        wire.close()


def test_the_scope_is_what_daphne_would_give(server):
    reply = httpx.get(server[1] + "/a%20b/c?x=1&y=%C3%A9",
                      headers={"X-Trace": "t1", "X_Sneaky": "dropped",
                               "Daphne-Root-Path": "/root"}, timeout=10).json()
    assert reply["path"] == "/a b/c" and reply["raw_path"] == "/a%20b/c"
    assert reply["query_string"] == "x=1&y=%C3%A9"
    assert reply["http_version"] == "1.1" and reply["scheme"] == "http"
    assert reply["root_path"] == "/root"
    assert reply["client"][0] == "127.0.0.1"
    names = [name for name, _ in reply["headers"]]
    assert ["x-trace", "t1"] in reply["headers"]
    assert "x_sneaky" not in names and "daphne-root-path" not in names
    assert all(name == name.lower() for name in names)


def test_a_websocket_upgrade_is_served(server):
    async def talk():
        async with connect(server[1].replace("http", "ws") + "/ws") as ws:
            await ws.send("one")
            first = await ws.recv()
            await ws.send("two")
            return first, await ws.recv()

    assert asyncio.run(talk()) == ("echo one", "echo two")
    assert httpx.get(server[1] + "/echo", timeout=10).status_code == 200


def test_a_websocket_upgrade_after_a_request_on_the_same_connection(lean):
    """A keep-alive connection whose second request upgrades: daphne's protocol takes over."""
    wire = Wire(lean)
    try:
        wire.send(get("/echo"))
        assert wire.reply()[0] == 200
        wire.send(get("/ws", b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                             b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                             b"Sec-WebSocket-Version: 13\r\n"))
        status, headers, _ = wire.reply()
        assert status == 101 and headers["upgrade"].lower() == "websocket"
        assert headers["sec-websocket-accept"] == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    finally:
        wire.close()


def test_a_client_that_leaves_mid_reply_is_seen_by_the_app(server):
    wire = Wire(server[1])
    wire.send(get("/hold?id=left"))
    wire._line()  # the reply has begun
    wire.close()
    wait_for(lambda: "left http.disconnect" in events(server[1]), 30, "the app's disconnect")


def test_a_reader_that_stops_holds_the_app_back_then_gets_everything(lean):
    """Backpressure: while the client reads nothing, the app's send waits once the socket's
    buffers are full (it does not pile 8 MiB up in the server); then all of it arrives."""
    from tests.support.asgi_probe import FLOOD_CHUNK, FLOOD_CHUNKS

    wire = Wire(lean)
    try:
        wire.send(get("/flood?id=slow"))
        blocked = wait_for(lambda: [e for e in events(lean) if e.startswith("slow blocked")],
                           60, "a send held back")
        held_at = int(blocked[0].split()[-1])
        assert held_at < len(FLOOD_CHUNK) * FLOOD_CHUNKS / 2
        status, _, body = wire.reply()
        assert status == 200 and len(body) == len(FLOOD_CHUNK) * FLOOD_CHUNKS
        wait_for(lambda: "slow done" in events(lean), 30, "the flood's end")
    finally:
        wire.close()


def test_an_idle_connection_is_closed_and_a_busy_one_is_not(lean):
    idle, busy = Wire(lean), Wire(lean)
    try:
        idle.send(get("/echo"))
        assert idle.reply()[0] == 200
        busy.send(get("/hold?id=busy"))
        busy._line()
        idle.sock.settimeout(IDLE_SECONDS * 20)
        assert idle.closed()  # the sweep ended it
        busy.sock.settimeout(0.2)
        with pytest.raises(TimeoutError):  # still open (nothing more to read yet)
            busy._fill()
    finally:
        idle.close()
        busy.close()


@pytest.mark.parametrize("request_bytes", [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: probe\r\nBad Header: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: probe\r\nX-A: a\x0bb\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: probe\r\nX-A: a\x85b\r\n\r\n",
    b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: probe\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nHost: probe\r\nContent-Length: 3\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nHost: probe\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
], ids=["garbage", "bad-name", "control-char", "x85", "non-ascii-path", "cl-and-te",
        "bad-chunk"])
def test_malformed_input_is_a_json_400(lean, request_bytes):
    wire = Wire(lean)
    try:
        wire.send(request_bytes)
        status, headers, body = wire.reply()
        assert status == 400 and headers["content-type"] == "application/json"
        assert json.loads(body)["error"]["message"]
        assert wire.closed()
    finally:
        wire.close()


def test_cr_lf_in_an_apps_headers_cannot_split_the_reply(lean):
    wire = Wire(lean)
    try:
        wire.send(get("/crlf-header"))
        status, headers, body = wire.reply()
        assert status == 200 and body == b"ok"
        assert "x-injected" not in headers and "x-injected-name" not in headers
        assert headers["x-echo"].startswith("a") and "x-injected" in headers["x-echo"]
        wire.send(get("/echo"))  # still in step: nothing was smuggled into the stream
        assert wire.reply()[0] == 200
    finally:
        wire.close()


def test_a_failing_application_gets_a_500_and_the_server_goes_on(lean):
    for path in ("/boom", "/no-reply", "/str-header"):
        reply = httpx.get(lean + path, timeout=10)
        assert reply.status_code == 500, path
        assert reply.json()["error"]["type"] == "server_error"
    wire = Wire(lean)
    try:  # failing mid-reply: the stream is cut short, not ended as if whole
        wire.send(get("/boom-mid"))
        with pytest.raises((EOFError, ConnectionResetError)):
            wire.reply()
    finally:
        wire.close()
    assert httpx.get(lean + "/echo", timeout=10).status_code == 200
