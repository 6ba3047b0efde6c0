"""LeanHTTPFactory: what `daphne.server.Server` builds its HTTP connections with
(llm_platform.lean_http.install puts it in place of daphne's `HTTPFactory`). It holds what the
connections share: daphne's own factory for WebSocket hand-overs, the `server` and `date`
header lines, and one timer that closes idle connections."""
from __future__ import annotations

import os
import time

from daphne.http_protocol import HTTPFactory as DaphneHTTPFactory
from twisted.internet import interfaces, protocol
from zope.interface import implementer

from llm_platform.lean_http.connection import LeanHTTPProtocol
from llm_platform.lean_http.reply import DateHeader


def idle_seconds() -> float:
    """API_HTTP_IDLE_SECONDS (Twisted's HTTPChannel.timeOut, 60): a connection with no request
    in progress, or in a request body that stopped arriving, and no bytes in for this long
    is closed."""
    return float(os.environ.get("API_HTTP_IDLE_SECONDS", "").strip() or 60)


@implementer(interfaces.IProtocolNegotiationFactory)
class LeanHTTPFactory(protocol.ServerFactory):
    def __init__(self, server, idle_s: float | None = None):
        self.server = server
        name = (server.server_name or "").encode()
        self.server_header = b"server: " + name + b"\r\n" if name else b""
        self.date_header = DateHeader()
        self.fallback = DaphneHTTPFactory(server)  # WebSockets
        self.connections: set[LeanHTTPProtocol] = set()
        self.idle_s = idle_seconds() if idle_s is None else idle_s
        self._sweep_s = min(5.0, self.idle_s / 4)
        self._sweep = None

    def buildProtocol(self, addr):
        return LeanHTTPProtocol(self)

    def startFactory(self) -> None:
        self.fallback.doStart()
        from twisted.internet import reactor

        self._sweep = reactor.callLater(self._sweep_s, self._check_idle)

    def stopFactory(self) -> None:
        self.fallback.doStop()
        if self._sweep is not None and self._sweep.active():
            self._sweep.cancel()

    def _check_idle(self) -> None:
        from twisted.internet import reactor

        now = time.monotonic()
        for connection in list(self.connections):
            connection.check_idle(now, self.idle_s)
        self._sweep = reactor.callLater(self._sweep_s, self._check_idle)

    def acceptableProtocols(self):
        return [b"http/1.1"]  # WebSockets are negotiated as HTTP/1.1 and upgraded
