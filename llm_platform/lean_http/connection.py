"""LeanHTTPProtocol: one HTTP/1.1 connection. llhttp parses its requests; each becomes an
`Exchange` whose application runs when the head is complete, one at a time in order (pipelined
requests wait their turn); heads the server refuses are answered here; a WebSocket upgrade hands
the connection to daphne's own protocol."""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING
from urllib.parse import unquote

import httptools
from daphne.utils import parse_x_forwarded_for
from twisted.internet import interfaces, protocol, tcp
from zope.interface import implementer

from llm_platform.lean_http.exchange import Exchange
from llm_platform.request_heads import (HEAD_LINE_LIMIT, HEAD_TOO_LARGE_REPLY, HEAD_TOTAL_LIMIT,
                                        MAX_HEADER_LINES, REPLY as LINE_TOO_LONG_REPLY,
                                        json_error_reply)

if TYPE_CHECKING:
    from llm_platform.lean_http.factory import LeanHTTPFactory

logger = logging.getLogger(__name__)

MAX_QUEUED = 4  # pipelined requests parsed ahead of the one being answered: then reading pauses

_PROTOCOL_ERROR = json_error_reply(500, "internal_error", "Server Error")
_BAD_HEADER_VALUE = json_error_reply(400, "invalid_header_value", "Invalid header value")
_BAD_TARGET = json_error_reply(400, "invalid_request_target",
                               "Invalid characters in the path or query string")


def head_error(url: bytes, headers: list) -> bytes | None:
    """The reply to a head over Twisted's limits (llm_platform.request_heads), else None."""
    longest = len(url) + 16  # method, spaces, version
    total = longest
    for name, value in headers:
        size = len(name) + len(value) + 4
        total += size
        if size > longest:
            longest = size
    if longest > HEAD_LINE_LIMIT:
        return LINE_TOO_LONG_REPLY
    if total > HEAD_TOTAL_LIMIT or len(headers) > MAX_HEADER_LINES:
        return HEAD_TOO_LARGE_REPLY
    return None


@implementer(interfaces.IPushProducer)
class LeanHTTPProtocol(protocol.Protocol):
    def __init__(self, factory: LeanHTTPFactory):
        self.factory = factory
        self.server = factory.server
        self.parser = httptools.HttpRequestParser(self)
        self.last_activity = time.monotonic()
        self.client = self.local = None
        self.scheme = "http"
        self.active: Exchange | None = None  # whose reply is being written
        self.parsing: Exchange | None = None  # whose body the parser is reading
        self.queued: deque[Exchange] = deque()
        self._pauses: set[str] = set()  # why reading is paused
        self.writes_paused = False
        self._drain: asyncio.Future | None = None
        self._closing = False  # replying no more: the rest of the input is dropped
        self._upgrade: tuple | None = None  # a WebSocket request waiting for the hand-over
        self._head_bytes: bytearray | None = None  # a head spread over several reads
        self._url: bytes | None = b""  # None between heads
        self._headers: list = []
        self._socket = None  # a plain TCP transport's socket: written directly (`write`)

    # -- Twisted -----------------------------------------------------------------------------

    def connectionMade(self) -> None:
        transport = self.transport
        peer, host = transport.getPeer(), transport.getHost()
        if hasattr(peer, "host") and hasattr(peer, "port"):
            self.client = [str(peer.host), peer.port]
            self.local = [str(host.host), host.port]
        self.scheme = "https" if interfaces.ISSLTransport.providedBy(transport) else "http"
        if isinstance(transport, tcp.Connection) and self.scheme == "http":
            self._socket = transport.socket
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
        except httptools.HttpParserCallbackError as error:  # this package's own fault
            logger.error("HTTP protocol error: %r", error.__context__ or error,
                         exc_info=error.__context__ or error)
            self._refuse(_PROTOCOL_ERROR)
            return
        except httptools.HttpParserError as error:
            self._refuse(json_error_reply(400, "invalid_http_request",
                                          f"Malformed HTTP request: {error}"))
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
                exchange.close()
                details = self.server.connections.get(exchange)
                if details is not None:
                    details.setdefault("disconnected", time.time())
        self.queued.clear()
        self._release_drain()

    def write(self, data: bytes) -> None:
        """Writes `data` on the connection: straight to the socket when the transport holds
        nothing unsent, the rest (what the socket did not take, or all of it behind data
        already buffered, or on a TLS transport) through the transport.

        Twisted's transport only buffers a write and has the reactor watch the socket for
        writability: two epoll_ctl calls (`addWriter`, `removeWriter`), a turn of the event
        loop and its wrappers (`callWithLogger`, `doWrite`) per write, before the bytes leave
        (the reactor's `addWriter` alone was 3.3 % of the API process's samples in a profile of
        32-stream rounds). A socket that cannot take it all (its kernel buffer full) leaves the rest to
        the transport, whose buffer then orders every later write and pauses the producer as
        before (backpressure); an error is left for the transport to find on its own write."""
        sock, transport = self._socket, self.transport
        if (sock is not None and not transport.dataBuffer and not transport._tempDataBuffer
                and transport.connected and not transport.disconnecting
                and not transport._writeDisconnecting and not transport._writeDisconnected):
            try:
                sent = sock.send(data)
            except OSError:  # full (EAGAIN), or broken: the transport's write finds out
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        transport.write(data)

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

    def abort(self) -> None:
        self._closing = True
        self.transport.abortConnection()

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
        refusal = head_error(url, raw_headers)
        if refusal is not None:
            self._refuse(refusal)
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
                self._refuse(_BAD_HEADER_VALUE)
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
            self._refuse(_BAD_TARGET)
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

    # -- exchanges, in order -------------------------------------------------------------------

    def _start(self, exchange: Exchange) -> None:
        self.active = exchange
        task = asyncio.get_event_loop().create_task(
            self.server.application(scope=exchange.scope, receive=exchange.receive,
                                    send=exchange.send))
        self.server.connections[exchange] = {"connected": exchange.started_at,
                                             "application_instance": task}
        task.add_done_callback(exchange.app_done)

    def reply_finished(self, exchange: Exchange) -> None:
        """`exchange`'s reply is written: the connection ends (as its head said) or the next
        request goes."""
        if self.server.action_logger:
            self._log(exchange)
        if not exchange.keep_alive:
            self._closing = True
            self.queued.clear()
            if exchange.body_complete:
                self.transport.loseConnection()
            else:
                self._half_close()
            return
        # keep-alive: its head was written after its whole body had arrived
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

    # -- refusals ------------------------------------------------------------------------------

    def _refuse(self, reply: bytes) -> None:
        """A request the server will not pass on: `reply`, then no more requests."""
        self.queued.clear()
        active = self.active
        if active is not None and not active.finished:
            if self.parsing is active:  # its own body is malformed: it ends here
                self.parsing = None
                if active.head_sent:
                    active.break_off()
                else:
                    active.error_reply(reply)
            else:  # a pipelined request after it: answered first, its reply closes
                self._closing = True
                active.keep_alive = False
            return
        self._closing = True
        self.write(reply)
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
        self._refuse(LINE_TOO_LONG_REPLY if longest > HEAD_LINE_LIMIT else HEAD_TOO_LARGE_REPLY)

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

    def check_idle(self, now: float, idle_s: float) -> None:
        if now - self.last_activity < idle_s or self.transport is None:
            return
        exchange = self.active
        if exchange is None:
            if self._closing:
                self.transport.abortConnection()
            else:
                self.transport.loseConnection()
        elif not exchange.body_complete and not exchange.finished:  # a body that stopped
            self.transport.abortConnection()
