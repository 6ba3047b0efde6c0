"""The API's HTTP/1.1 inside daphne: llhttp (httptools) in place of Twisted's `HTTPChannel`.

daphne reads HTTP through Twisted's `twisted.web.http` (a line receiver in Python, a `Request`
object with two header tables, a temporary content file and a `Deferred` per request) and writes
each reply through it again. Against a trivial ASGI app that was about 0.6 ms of CPU per request
on the 2-core machines here, when the whole API's budget is 1.5 ms (issue 17; numbers in
benchmarks/README.md, "frontdoor10"). This module keeps daphne (its CLI, endpoints, `--fd`
sockets, signal handling, the application and timeout checkers, WebSockets through Autobahn) and
replaces only the HTTP/1.1 protocol its factory builds per connection:

- parsing is llhttp's (C, through `httptools`): request line, headers, Content-Length and chunked
  bodies, keep-alive and pipelining;
- the application starts when the head is complete, with `receive` / `send` callables of a
  per-request `Exchange` (no queue, no Deferred): the body is handed over as it arrives, the
  reply's head goes out with its first body bytes (one write for a whole reply), streams without
  a Content-Length are chunked;
- a WebSocket upgrade hands the connection to daphne's own Twisted protocol, which speaks it as
  before (`_hand_over`).

What daphne checked, this checks the same way: header names and values (llhttp rejects what
RFC 9110 does; `\\x85` is refused as daphne does), an ASCII path and query string, header names
with `_` dropped (CVE-2015-0219), `daphne-root-path`, `--proxy-headers`, `--http-timeout`, the
application close timeout, the access log (`server.log_action`). Twisted's limits on a request
head stay: a request line or one header line over 16 KiB is a 431, a head over 16 KiB in all or
with over 500 header lines a 400, both with an OpenAI-style JSON body
(llm_platform.request_heads); a connection idle for a minute between requests (or in a body
that stopped arriving) is closed (`API_HTTP_IDLE_SECONDS`). Writes have backpressure: when the
socket's buffer is full, `send` waits for it to drain.

`API_HTTP_PROTOCOL` chooses (llm_platform/server.py): `lean` (unset or empty: the default) or
`daphne` (Twisted's protocol, e.g. to compare with `benchmarks.gateway_ab`).
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from email.utils import formatdate
from collections import deque
from http import HTTPStatus
from urllib.parse import unquote

import httptools
from daphne.http_protocol import HTTPFactory as DaphneHTTPFactory
from daphne.utils import parse_x_forwarded_for
from twisted.internet import interfaces, protocol
from zope.interface import implementer

from llm_platform.request_heads import (HEAD_LINE_LIMIT, HEAD_TOO_LARGE_REPLY, HEAD_TOTAL_LIMIT,
                                        MAX_HEADER_LINES, REPLY as LINE_TOO_LONG_REPLY,
                                        json_error_reply)

logger = logging.getLogger(__name__)

# Twisted's HTTPChannel.timeOut: no request in progress (or a body that stopped), no bytes in.
IDLE_TIMEOUT_SECONDS = float(os.environ.get("API_HTTP_IDLE_SECONDS", "").strip() or 60)
# How often idle connections are looked for (one timer for all of them).
SWEEP_SECONDS = min(5.0, IDLE_TIMEOUT_SECONDS / 4)
MAX_QUEUED = 4  # pipelined requests parsed ahead of the one being answered: then reading pauses
BODY_BACKLOG_BYTES = 1 << 20  # unread request body held before reading pauses

_DISCONNECT = {"type": "http.disconnect"}
_NO_BODY_STATUSES = frozenset({204, 304})
_STATUS_LINES: dict[int, bytes] = {}


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "Unknown"
        line = _STATUS_LINES[status] = b"HTTP/1.1 %d %s\r\n" % (status, phrase.encode())
    return line


_date = [0, b""]


def _date_header() -> bytes:
    """`date: ...\\r\\n`, formatted once a second."""
    now = int(time.time())
    if now != _date[0]:
        _date[0] = now
        _date[1] = b"date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
    return _date[1]


class Exchange:
    """One request and its reply: the ASGI `receive` and `send` of one application instance.

    Registered in daphne's `server.connections` while its application runs, so daphne's checkers
    see it as they see their own requests (`check_timeouts`, `handle_exception`, the close
    timeout after a disconnect, cancellation at shutdown)."""

    __slots__ = ("proto", "scope", "method", "keep_alive", "head_only", "started_at",
                 "_body", "_body_bytes", "body_complete", "_final_given", "_waiter",
                 "_expect_continue", "status", "headers", "head_sent", "chunked",
                 "finished", "gone", "sent_bytes")

    def __init__(self, proto: "LeanHTTPProtocol", scope: dict, keep_alive: bool,
                 expect_continue: bool):
        self.proto = proto
        self.scope = scope
        self.method = scope["method"]
        self.keep_alive = keep_alive
        self.head_only = self.method == "HEAD"
        self.started_at = time.time()
        self._body: list[bytes] = []
        self._body_bytes = 0
        self.body_complete = False
        self._final_given = False
        self._waiter: asyncio.Future | None = None
        self._expect_continue = expect_continue
        self.status = 0
        self.headers = None
        self.head_sent = False
        self.chunked = False
        self.finished = False
        self.gone = False
        self.sent_bytes = 0

    # -- from the parser -------------------------------------------------------------------

    def add_body(self, data: bytes) -> None:
        if self.finished or self.gone:
            return  # a reply already went: the rest of the body is read and dropped
        self._body.append(data)
        self._body_bytes += len(data)
        self._wake()
        if self._body_bytes > BODY_BACKLOG_BYTES:
            self.proto.pause_reading("body")

    def end_body(self) -> None:
        self.body_complete = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # -- ASGI --------------------------------------------------------------------------------

    async def receive(self) -> dict:
        while True:
            if self.gone or self.finished:
                return _DISCONNECT
            if not self._final_given:
                if self._body or self.body_complete:
                    body = self._body
                    data = body[0] if len(body) == 1 else b"".join(body)
                    body.clear()
                    if self._body_bytes > BODY_BACKLOG_BYTES:
                        self.proto.resume_reading("body")
                    self._body_bytes = 0
                    more = not self.body_complete
                    self._final_given = not more
                    return {"type": "http.request", "body": data, "more_body": more}
                if self._expect_continue:
                    self._expect_continue = False
                    self.proto.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            await waiter

    async def send(self, message: dict) -> None:
        kind = message["type"]
        if kind == "http.response.body":
            if not self.head_sent and self.status == 0:
                raise ValueError("HTTP response has not yet been started but got "
                                 "http.response.body")
            if self.finished or self.gone:
                return
            more = message.get("more_body", False)
            self.proto.write_body(self, message.get("body", b""), more)
            if more and self.proto.writes_paused:
                await self.proto.drained()
        elif kind == "http.response.start":
            if self.status:
                raise ValueError("HTTP response has already been started")
            if "status" not in message:
                raise ValueError("Specifying a status code is required for a Response message.")
            self.status = message["status"]
            self.headers = message.get("headers", ())
        else:
            raise ValueError(f"Cannot handle message type {kind}!")

    # -- daphne's checkers -----------------------------------------------------------------

    def check_timeouts(self) -> None:
        timeout = self.proto.server.http_timeout
        if timeout and not self.finished and not self.gone \
                and time.time() - self.started_at > timeout:
            if self.head_sent:
                logger.warning("Application timed out while sending response")
                self.proto.close_broken(self)
            else:
                self.proto.error_reply(self, json_error_reply(
                    503, "application_timeout",
                    "The application failed to respond within the time limit."))

    def handle_exception(self, exception: BaseException) -> None:
        if self.finished or self.gone:
            return
        if self.head_sent:  # a reply cut short: the client must not take it as whole
            self.proto.close_broken(self)
        else:
            self.proto.error_reply(self, json_error_reply(
                500, "internal_error", "Exception inside application."))

    def app_done(self, task: asyncio.Task) -> None:
        details = self.proto.server.connections.pop(self, None)
        if details is None or "application_instance" not in details:
            return  # daphne's application checker saw it end first and handled it
        if task.cancelled():
            exception: BaseException | None = None
        else:
            exception = task.exception()
        if exception is not None:
            if isinstance(exception, KeyboardInterrupt):
                self.proto.server.stop()
                return
            logger.error("Exception inside application: %s", exception, exc_info=exception)
            self.handle_exception(exception)
        elif not self.finished and not self.gone:
            if not self.head_sent and not task.cancelled():
                logger.error("Application instance for %s %s returned without a response",
                             self.method, self.scope["path"])
            self.handle_exception(RuntimeError("no complete response"))


@implementer(interfaces.IPushProducer)
class LeanHTTPProtocol(protocol.Protocol):
    """One connection: parses requests with llhttp, runs one application instance per request
    (pipelined requests wait their turn), writes replies."""

    def __init__(self, factory: "LeanHTTPFactory"):
        self.factory = factory
        self.server = factory.server
        self.parser = httptools.HttpRequestParser(self)
        self.last_activity = time.monotonic()
        self.client = self.local = None
        self.scheme = "http"
        self.active: Exchange | None = None  # whose reply is being written
        self.parsing: Exchange | None = None  # whose body the parser is reading
        self.queued: deque[Exchange] = deque()
        self._pauses: set[str] = set()
        self.writes_paused = False
        self._drain: asyncio.Future | None = None
        self._closing = False  # replying no more: the rest of the input is dropped
        self._upgrade: tuple | None = None
        self._head_bytes: bytearray | None = None  # a head spread over several reads
        self._url = b""
        self._headers: list = []

    # -- Twisted -----------------------------------------------------------------------------

    def connectionMade(self) -> None:
        transport = self.transport
        peer, host = transport.getPeer(), transport.getHost()
        if hasattr(peer, "host") and hasattr(peer, "port"):
            self.client = [str(peer.host), peer.port]
            self.local = [str(host.host), host.port]
        self.scheme = "https" if interfaces.ISSLTransport.providedBy(transport) else "http"
        set_no_delay = getattr(transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            try:
                set_no_delay(True)
            except OSError:
                pass
        transport.registerProducer(self, True)
        self.factory.connections.add(self)

    def dataReceived(self, data: bytes) -> None:
        self.last_activity = time.monotonic()
        if self._closing:
            return
        head = self._head_bytes
        if head is not None:  # the current head began in an earlier read
            head += data
            if len(head) > HEAD_TOTAL_LIMIT:
                self._head_too_large(head)
                return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._upgraded(data, upgrade.args[0])
            return
        except httptools.HttpParserCallbackError as error:  # this module's own fault
            logger.error("HTTP protocol error: %r", error.__context__ or error,
                         exc_info=error.__context__ or error)
            self._refuse(500, "internal_error", "Server Error")
            return
        except httptools.HttpParserError as error:
            self._bad_request(data, error)
            return
        if self._url is not None:  # still inside a head
            if head is None:
                head = self._head_bytes = bytearray(data)
            if len(head) > HEAD_TOTAL_LIMIT:
                self._head_too_large(head)
        elif head is not None:
            self._head_bytes = None

    def connectionLost(self, reason=None) -> None:
        self.factory.connections.discard(self)
        self._closing = True
        for exchange in (self.active, *self.queued):
            if exchange is not None and not exchange.gone:
                exchange.gone = True
                exchange._wake()
                details = self.server.connections.get(exchange)
                if details is not None:
                    details.setdefault("disconnected", time.time())
        self.queued.clear()
        self._release_drain()

    # IPushProducer: the transport pauses us when its write buffer is full
    def pauseProducing(self) -> None:
        self.writes_paused = True

    def resumeProducing(self) -> None:
        self.writes_paused = False
        self._release_drain()

    def stopProducing(self) -> None:
        self.writes_paused = False
        self._release_drain()

    def _release_drain(self) -> None:
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    async def drained(self) -> None:
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_future()
        await self._drain

    def pause_reading(self, why: str) -> None:
        if not self._pauses:
            self.transport.pauseProducing()
        self._pauses.add(why)

    def resume_reading(self, why: str) -> None:
        if why in self._pauses:
            self._pauses.discard(why)
            if not self._pauses and not self._closing:
                self.transport.resumeProducing()

    # -- llhttp callbacks ----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        url, raw_headers = self._url, self._headers
        self._url = None  # out of the head
        error = self._head_error(url, raw_headers)
        if error is not None:
            self._refuse(*error)
            return
        parser = self.parser
        method = parser.get_method().decode("ascii")
        http_version = parser.get_http_version()
        server = self.server
        root_path = server.root_path
        headers = []
        upgrade = expect = None
        for name, value in raw_headers:
            name = name.lower()
            if b"_" in name:
                continue
            if b"\x85" in value:
                self._refuse(400, "invalid_header_value", "Invalid header value")
                return
            if name == b"upgrade":
                upgrade = value.lower()
            elif name == b"expect":
                expect = value.lower()
            elif name == b"daphne-root-path":
                root_path = unquote(value.decode("ascii", "replace"))
                continue
            headers.append((name, value))
        path, _, query = url.partition(b"?")
        if b"#" in query:
            query = query.partition(b"#")[0]
        try:
            path_text = path.decode("ascii")
            query.decode("ascii")
        except UnicodeDecodeError:
            self._refuse(400, "invalid_request_target", "Invalid characters in the path or "
                         "query string")
            return
        if upgrade == b"websocket" and parser.should_upgrade():
            self._upgrade = (method, url, raw_headers)
            return
        client, scheme = self.client, self.scheme
        if server.proxy_forwarded_address_header:
            by_name: dict = {}
            for name, value in headers:
                by_name.setdefault(name, []).append(value)
            client, scheme = parse_x_forwarded_for(
                by_name, server.proxy_forwarded_address_header,
                server.proxy_forwarded_port_header, server.proxy_forwarded_proto_header,
                client, scheme)
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": http_version,
            "method": method,
            "path": unquote(path_text) if b"%" in path else path_text,
            "raw_path": path,
            "root_path": root_path,
            "scheme": scheme,
            "query_string": query,
            "headers": headers,
            "client": client,
            "server": self.local,
        }
        keep_alive = http_version == "1.1" and parser.should_keep_alive()
        exchange = Exchange(self, scope, keep_alive,
                            expect == b"100-continue" and http_version == "1.1")
        self.parsing = exchange
        if self.active is None:
            self._start(exchange)
        else:
            self.queued.append(exchange)
            if len(self.queued) >= MAX_QUEUED:
                self.pause_reading("pipeline")

    def on_body(self, body: bytes) -> None:
        exchange = self.parsing
        if exchange is not None:
            exchange.add_body(body)

    def on_message_complete(self) -> None:
        exchange, self.parsing = self.parsing, None
        if exchange is not None:
            exchange.end_body()
            if exchange.finished:  # the reply went before the body had all arrived
                self._next()

    # -- requests --------------------------------------------------------------------------

    def _head_error(self, url: bytes, headers: list) -> tuple | None:
        longest = len(url) + 16  # method, spaces, version
        total = longest
        for name, value in headers:
            size = len(name) + len(value) + 4
            total += size
            if size > longest:
                longest = size
        if longest > HEAD_LINE_LIMIT:
            return (431,)
        if total > HEAD_TOTAL_LIMIT or len(headers) > MAX_HEADER_LINES:
            return (400,)
        return None

    def _start(self, exchange: Exchange) -> None:
        self.active = exchange
        loop = asyncio.get_event_loop()
        task = loop.create_task(
            self.server.application(scope=exchange.scope, receive=exchange.receive,
                                    send=exchange.send))
        self.server.connections[exchange] = {"connected": exchange.started_at,
                                             "application_instance": task}
        task.add_done_callback(exchange.app_done)

    def write_body(self, exchange: Exchange, body: bytes, more: bool) -> None:
        transport = self.transport
        if not exchange.head_sent:
            head = self._head(exchange, None if more else len(body))
            exchange.head_sent = True
            if exchange.head_only or exchange.status in _NO_BODY_STATUSES \
                    or exchange.status < 200:
                data = head
                body = b""
            elif exchange.chunked and body:
                data = head + b"%x\r\n%s\r\n" % (len(body), body)
            else:
                data = head + body
            if not more and exchange.chunked:
                data += b"0\r\n\r\n"
            transport.write(data)
            exchange.sent_bytes += len(body)
        elif exchange.head_only or exchange.status in _NO_BODY_STATUSES:
            pass
        elif exchange.chunked:
            if body:
                transport.write(b"%x\r\n%s\r\n%s" % (len(body), body,
                                                     b"" if more else b"0\r\n\r\n"))
                exchange.sent_bytes += len(body)
            elif not more:
                transport.write(b"0\r\n\r\n")
        elif body:
            transport.write(body)
            exchange.sent_bytes += len(body)
        if not more:
            self._finished(exchange)

    def _head(self, exchange: Exchange, length: int | None) -> bytes:
        """The reply's status line and headers; `length`: a whole reply's body size (None:
        a stream)."""
        status = exchange.status
        parts = [_status_line(status)]
        add = parts.append
        has_length = has_server = has_date = chunked_by_app = False
        for name, value in exchange.headers:
            if type(name) is not bytes or type(value) is not bytes:
                self.error_reply(exchange, json_error_reply(500, "internal_error",
                                                            "Server Error"))
                raise ValueError(f"Header {name!r}: {value!r}: names and values must be bytes")
            lowered = name.lower()
            if lowered == b"content-length":
                has_length = True
            elif lowered == b"connection":
                if b"close" in value.lower():
                    exchange.keep_alive = False
            elif lowered == b"transfer-encoding":
                chunked_by_app = True
            elif lowered == b"server":
                has_server = True
            elif lowered == b"date":
                has_date = True
            if b"\n" in value or b"\r" in value:
                value = value.replace(b"\r", b" ").replace(b"\n", b" ")
            if b"\n" in name or b"\r" in name or b":" in name:
                name = name.replace(b"\r", b"").replace(b"\n", b"").replace(b":", b"")
            add(name)
            add(b": ")
            add(value)
            add(b"\r\n")
        bodiless = status in _NO_BODY_STATUSES or status < 200
        if not has_length and not chunked_by_app and not bodiless:
            if length is not None:
                add(b"content-length: %d\r\n" % length)
            elif exchange.scope["http_version"] == "1.1":
                exchange.chunked = True
                add(b"transfer-encoding: chunked\r\n")
            else:
                exchange.keep_alive = False  # the end of the body is the end of the connection
        if not has_server and self.server.server_name:
            add(b"server: " + self.factory.server_name + b"\r\n")
        if not has_date:
            add(_date_header())
        if not exchange.keep_alive or not exchange.body_complete:
            exchange.keep_alive = False
            add(b"connection: close\r\n")
        add(b"\r\n")
        return b"".join(parts)

    def _finished(self, exchange: Exchange) -> None:
        exchange.finished = True
        exchange._wake()  # a receive() waiting now returns http.disconnect
        server = self.server
        if server.action_logger:
            self._log(exchange)
        if not exchange.keep_alive:
            self._closing = True
            self.queued.clear()
            if exchange.body_complete:
                self.transport.loseConnection()
            else:
                self._half_close()
            return
        if self.parsing is not exchange:
            self._next()

    def _next(self) -> None:
        self.active = None
        if self._closing:
            return
        self.resume_reading("pipeline")
        if self.queued:
            self._start(self.queued.popleft())
        elif self._upgrade is not None:
            self._hand_over(*self._upgrade)

    def _log(self, exchange: Exchange) -> None:
        scope = exchange.scope
        try:
            query = scope["query_string"]
            self.server.log_action("http", "complete", {
                "path": scope["raw_path"].decode("ascii")
                + ("?" + query.decode("ascii") if query else ""),
                "status": exchange.status,
                "method": exchange.method,
                "client": "%s:%s" % tuple(scope["client"]) if scope["client"] else None,
                "time_taken": time.time() - exchange.started_at,
                "size": exchange.sent_bytes,
            })
        except Exception:
            logger.exception("access log")

    # -- errors --------------------------------------------------------------------------------

    def error_reply(self, exchange: Exchange, reply: bytes) -> None:
        """A server-level error reply in place of the application's (none was sent yet)."""
        if exchange.head_sent or exchange.finished or exchange.gone:
            return
        exchange.status = int(reply[9:12])
        exchange.head_sent = True
        exchange.keep_alive = False
        self.transport.write(reply)
        self._finished(exchange)

    def close_broken(self, exchange: Exchange) -> None:
        """A reply that cannot be completed: the connection ends without the final chunk, so
        the client sees it was cut short."""
        exchange.finished = True
        exchange._wake()
        self._closing = True
        self.transport.abortConnection()

    def _refuse(self, status: int, code: str = "", message: str = "") -> None:
        """A head the server will not pass on: the reply, then no more requests."""
        if status == 431:
            reply = LINE_TOO_LONG_REPLY
        elif not code:
            reply = HEAD_TOO_LARGE_REPLY
        else:
            reply = json_error_reply(status, code, message)
        self.queued.clear()
        active = self.active
        if active is not None and not active.finished:
            if self.parsing is active:  # its own body is malformed: it ends here
                self.parsing = None
                if active.head_sent:
                    self.close_broken(active)
                else:
                    self.error_reply(active, reply)
            else:  # a pipelined request after it: answered first, its reply closes
                self._closing = True
                active.keep_alive = False
            return
        self._closing = True
        self.transport.write(reply)
        self._half_close()

    def _half_close(self) -> None:
        """The reply and a FIN go out while what the client still sends is read and dropped
        (closing with unread input sends a reset, which can destroy the reply in flight);
        the idle sweep ends a client that never stops."""
        self._closing = True
        self._pauses.clear()
        self.transport.resumeProducing()
        close_write = getattr(self.transport, "loseWriteConnection", None)
        (close_write or self.transport.loseConnection)()

    def _head_too_large(self, head: bytearray) -> None:
        self._head_bytes = None
        longest = max(len(line) for line in bytes(head).split(b"\n"))
        self._refuse(431 if longest > HEAD_LINE_LIMIT else 400)

    def _bad_request(self, data: bytes, error: Exception) -> None:
        self._refuse(400, "invalid_http_request", f"Malformed HTTP request: {error}")

    # -- upgrades -----------------------------------------------------------------------------

    def _upgraded(self, data: bytes, offset: int) -> None:
        tail = data[offset:]
        if self._upgrade is None:
            # Not a WebSocket (h2c, say): the request was served as HTTP and so is what follows.
            self.parser = httptools.HttpRequestParser(self)
            if tail:
                self.dataReceived(tail)
            return
        self._upgrade = (*self._upgrade, tail)
        if self.active is None:
            self._hand_over(*self._upgrade)
        else:
            self.pause_reading("upgrade")

    def _hand_over(self, method: str, url: bytes, headers: list, tail: bytes = b"") -> None:
        """daphne's own protocol takes the connection, fed the request as it came."""
        lines = [method.encode() + b" " + url + b" HTTP/1.1\r\n"]
        for name, value in headers:
            lines.append(name + b": " + value + b"\r\n")
        lines.append(b"\r\n")
        data = b"".join(lines) + tail
        transport = self.transport
        self.factory.connections.discard(self)
        self._closing = True
        transport.unregisterProducer()
        if self._pauses:
            self._pauses.clear()
            transport.resumeProducing()
        channel = self.factory.fallback.buildProtocol(transport.getPeer())
        if hasattr(transport, "wrappedProtocol"):  # TLS wraps the protocol
            transport.wrappedProtocol = channel
        else:
            transport.protocol = channel
        self.transport = None
        channel.makeConnection(transport)
        channel.dataReceived(data)

    # -- idle connections --------------------------------------------------------------------

    def check_idle(self, now: float) -> None:
        if now - self.last_activity < IDLE_TIMEOUT_SECONDS or self.transport is None:
            return
        exchange = self.active
        if exchange is None:
            if self._closing:
                self.transport.abortConnection()
            else:
                self.transport.loseConnection()
        elif not exchange.body_complete and not exchange.finished:  # a body that stopped
            self.transport.abortConnection()


@implementer(interfaces.IProtocolNegotiationFactory)
class LeanHTTPFactory(protocol.ServerFactory):
    """What `daphne.server.Server` builds its HTTP connections with (llm_platform/server.py
    puts it in place of daphne's `HTTPFactory`)."""

    def __init__(self, server):
        self.server = server
        self.server_name = (server.server_name or "").encode()
        self.fallback = DaphneHTTPFactory(server)  # WebSockets (and h2, where Twisted has it)
        self.connections: set[LeanHTTPProtocol] = set()
        self._sweep = None

    def buildProtocol(self, addr):
        return LeanHTTPProtocol(self)

    def startFactory(self) -> None:
        self.fallback.doStart()
        from twisted.internet import reactor

        self._sweep = reactor.callLater(SWEEP_SECONDS, self._check_idle)

    def stopFactory(self) -> None:
        self.fallback.doStop()
        if self._sweep is not None and self._sweep.active():
            self._sweep.cancel()

    def _check_idle(self) -> None:
        from twisted.internet import reactor

        now = time.monotonic()
        for connection in list(self.connections):
            connection.check_idle(now)
        self._sweep = reactor.callLater(SWEEP_SECONDS, self._check_idle)

    def acceptableProtocols(self):
        return [b"http/1.1"]  # WebSockets are negotiated as HTTP/1.1 and upgraded


def install() -> None:
    """Before daphne's Server runs: its HTTP connections get LeanHTTPProtocol."""
    import daphne.server

    daphne.server.HTTPFactory = LeanHTTPFactory
