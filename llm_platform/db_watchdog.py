"""A read timeout for PostgreSQL on the request path.

libpq has a connect timeout but no read timeout: a hung PostgreSQL (SIGSTOP, a partition that
keeps TCP open) blocks a query for ever, and under ASGI it blocks more than the query: the
request's own ORM thread, on which Django also runs its sync middleware, so not even a 503
could leave. The watchdog bounds every query run under `query_timeout(seconds)` (the API sets
DB_QUERY_TIMEOUT_SECONDS for each request): a query still running past its bound has its
socket shut down from the watchdog's thread, so the driver fails it at once with
OperationalError (the API answers 503 database_unavailable) and the pool discards the
connection. Queries outside such a scope (Celery roll-ups, migrations) are not bounded.

Invariant: a socket is shut down only while its query is registered (registration and the
shutdown hold one lock), so a descriptor reused after the query ended is never touched.
"""
from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from contextvars import ContextVar

logger = logging.getLogger(__name__)

_timeout: ContextVar[float | None] = ContextVar("db_query_timeout", default=None)


class query_timeout:  # noqa: N801 - used as a function: `with query_timeout(s):`
    """Bound the queries run in this context (asgiref carries it into sync_to_async threads).
    A class, not a generator context manager: every API request enters one."""

    __slots__ = ("_seconds", "_token")

    def __init__(self, seconds: float | None):
        self._seconds = seconds

    def __enter__(self) -> None:
        self._token = _timeout.set(self._seconds)

    def __exit__(self, *exc) -> None:
        _timeout.reset(self._token)


class QueryWatchdog:
    """A Django execute wrapper plus one daemon thread that cuts overrunning queries."""

    def __init__(self, tick_s: float = 0.1, clock=time.monotonic):
        self._tick_s = tick_s
        self._clock = clock
        self._lock = threading.Lock()
        self._running: dict[int, tuple[float, int]] = {}  # id -> (deadline, socket fd)
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def __call__(self, execute, sql, params, many, context):
        seconds = _timeout.get()
        if not seconds:
            return execute(sql, params, many, context)
        try:
            fd = context["connection"].connection.pgconn.socket
        except Exception:  # noqa: BLE001 - not a live psycopg connection: nothing to bound
            return execute(sql, params, many, context)
        query_id = next(self._ids)
        with self._lock:
            self._running[query_id] = (self._clock() + seconds, fd)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="db-watchdog",
                                                daemon=True)
                self._thread.start()
        try:
            return execute(sql, params, many, context)
        finally:
            with self._lock:
                self._running.pop(query_id, None)

    def _watch(self) -> None:
        while True:
            time.sleep(self._tick_s)
            now = self._clock()
            with self._lock:
                expired = [(qid, fd) for qid, (end, fd) in self._running.items() if now >= end]
                for query_id, fd in expired:
                    del self._running[query_id]
                    self._cut(fd)

    @staticmethod
    def _cut(fd: int) -> None:
        logger.warning("PostgreSQL query over its time bound: cutting its connection")
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes the driver's wait: the query fails
        except OSError:
            pass
        finally:
            sock.detach()  # the descriptor stays the driver's to close


WATCHDOG = QueryWatchdog()  # one per process: it is a thread


def install(sender, connection, **kwargs) -> None:
    """`connection_created` receiver: every new connection's queries go through the watchdog."""
    if connection.vendor == "postgresql" and WATCHDOG not in connection.execute_wrappers:
        connection.execute_wrappers.append(WATCHDOG)
