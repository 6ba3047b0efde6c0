"""Exchange: one request and its reply, the ASGI `receive` and `send` of one application
instance, writing the reply through its connection's transport."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from llm_platform.lean_http.reply import CONTINUE, chunk, has_body, reply_head
from llm_platform.request_heads import json_error_reply

if TYPE_CHECKING:
    from llm_platform.lean_http.connection import LeanHTTPProtocol

logger = logging.getLogger(__name__)

BODY_BACKLOG_BYTES = 1 << 20  # unread request body held before the connection stops reading

_DISCONNECT = {"type": "http.disconnect"}
_SERVER_ERROR = json_error_reply(500, "internal_error", "Exception inside application.")
_TIMED_OUT = json_error_reply(503, "application_timeout",
                              "The application failed to respond within the time limit.")


class Exchange:
    """One request and its reply.

    Registered in daphne's `server.connections` while its application runs, so daphne's checkers
    see it as they see their own requests (`check_timeouts`, `handle_exception`, the close
    timeout after a disconnect, cancellation at shutdown)."""

    __slots__ = ("conn", "scope", "method", "keep_alive", "started_at", "_body",
                 "_body_bytes", "body_complete", "_final_given", "_waiter", "_expect_continue",
                 "status", "headers", "head_sent", "chunked", "_has_body", "finished", "gone",
                 "sent_bytes", "_on_gone")

    def __init__(self, conn: LeanHTTPProtocol, scope: dict, keep_alive: bool,
                 expect_continue: bool):
        self.conn = conn
        self.scope = scope
        self.method = scope["method"]
        self.keep_alive = keep_alive
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
        self._has_body = True
        self.finished = False  # the whole reply was written (or the exchange was given up)
        self.gone = False  # the connection closed
        self.sent_bytes = 0  # body bytes written (the access log's size)
        self._on_gone = None  # `watch_gone`'s callback

    def watch_gone(self, callback) -> None:
        """`callback()` once the connection closes before the reply's end (None: no more):
        what a task waiting in `receive` for `http.disconnect` learns, without the task."""
        self._on_gone = callback

    def close(self) -> None:
        """The connection closed: a `receive` waiting returns `http.disconnect`, and the
        `watch_gone` callback runs."""
        if self.gone:
            return
        self.gone = True
        self.wake()
        callback, self._on_gone = self._on_gone, None
        if callback is not None and not self.finished:
            callback()

    # -- from the parser -------------------------------------------------------------------

    def add_body(self, data: bytes) -> None:
        if self.finished or self.gone:
            return  # a reply already went: the rest of the body is read and dropped
        self._body.append(data)
        self._body_bytes += len(data)
        self.wake()
        if self._body_bytes > BODY_BACKLOG_BYTES:
            self.conn.pause_reading("body")

    def end_body(self) -> None:
        self.body_complete = True
        self.wake()

    def wake(self) -> None:
        """A `receive` waiting now looks again (body, end of the reply, disconnect)."""
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
                        self.conn.resume_reading("body")
                    self._body_bytes = 0
                    more = not self.body_complete
                    self._final_given = not more
                    return {"type": "http.request", "body": data, "more_body": more}
                if self._expect_continue:
                    self._expect_continue = False
                    self.conn.write(CONTINUE)
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
            self._write(message.get("body", b""), more)
            if more and self.conn.writes_paused:
                await self.conn.drained()
        elif kind == "http.response.start":
            if self.status:
                raise ValueError("HTTP response has already been started")
            if "status" not in message:
                raise ValueError("Specifying a status code is required for a Response message.")
            self.status = message["status"]
            self.headers = message.get("headers", ())
        else:
            raise ValueError(f"Cannot handle message type {kind}!")

    def _write(self, body: bytes, more: bool) -> None:
        conn = self.conn
        if not self.head_sent:
            factory = conn.factory
            try:
                head = reply_head(self.status, self.headers,
                                  length=None if more else len(body),
                                  http_1_1=self.scope["http_version"] == "1.1",
                                  keep_alive=self.keep_alive and self.body_complete,
                                  server=factory.server_header, date=factory.date_header())
            except TypeError as exc:  # as daphne: a 500, and the application hears why
                self.error_reply(_SERVER_ERROR)
                raise ValueError(str(exc)) from None
            self.head_sent = True
            self.chunked, self.keep_alive = head.chunked, head.keep_alive
            self._has_body = has_body(self.status, self.method == "HEAD")
            if not self._has_body:
                data = head.data
            elif self.chunked:
                data = head.data + chunk(body, last=not more)
            else:
                data = head.data + body
            conn.write(data)
        elif not self._has_body:
            pass
        elif self.chunked:
            if body or not more:
                conn.write(chunk(body, last=not more))
        elif body:
            conn.write(body)
        if self._has_body:
            self.sent_bytes += len(body)
        if not more:
            self.finished = True
            self.wake()  # a receive() waiting now returns http.disconnect
            conn.reply_finished(self)

    def error_reply(self, reply: bytes) -> None:
        """A server-level error reply in place of the application's (none was sent yet), and
        the connection ends after it."""
        if self.head_sent or self.finished or self.gone:
            return
        self.status = int(reply[9:12])
        self.head_sent = True
        self.keep_alive = False
        self.finished = True
        self.wake()
        self.conn.write(reply)
        self.conn.reply_finished(self)

    def break_off(self) -> None:
        """A reply that cannot be completed: the connection ends without the final chunk, so
        the client sees it was cut short."""
        self.finished = True
        self.wake()
        self.conn.abort()

    # -- daphne's checkers -----------------------------------------------------------------

    def check_timeouts(self) -> None:
        timeout = self.conn.server.http_timeout
        if timeout and not self.finished and not self.gone \
                and time.time() - self.started_at > timeout:
            if self.head_sent:
                logger.warning("Application timed out while sending response")
                self.break_off()
            else:
                self.error_reply(_TIMED_OUT)

    def handle_exception(self, exception: BaseException) -> None:
        if self.finished or self.gone:
            return
        if self.head_sent:  # a reply cut short: the client must not take it as whole
            self.break_off()
        else:
            self.error_reply(_SERVER_ERROR)

    def app_done(self, task: asyncio.Task) -> None:
        details = self.conn.server.connections.pop(self, None)
        if details is None or "application_instance" not in details:
            return  # daphne's application checker saw it end first and handled it
        exception = None if task.cancelled() else task.exception()
        if exception is not None:
            if isinstance(exception, KeyboardInterrupt):
                self.conn.server.stop()
                return
            logger.error("Exception inside application: %s", exception, exc_info=exception)
            self.handle_exception(exception)
        elif not self.finished and not self.gone:
            if not self.head_sent and not task.cancelled():
                logger.error("Application instance for %s %s returned without a response",
                             self.method, self.scope["path"])
            self.handle_exception(RuntimeError("no complete response"))
