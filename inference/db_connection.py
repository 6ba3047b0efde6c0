"""Give a request's database connection back to the pool before it waits or streams.

Under ASGI Django runs a request's ORM calls on that request's own thread and keeps the
connection it opened until the request ends. A request that then waits in the admission queue
or streams for seconds would hold one of the pool's few connections all that time: under a
burst the pool (DB_POOL_MAX_SIZE per process) runs dry and every request, the bursting
tenant's and everyone else's, waits DB_POOL_TIMEOUT_SECONDS for a connection, then fails with
503 database_unavailable. Closing a pooled connection returns it to the pool; a later query
borrows one again.

Most requests never open one: the key, the tenant's limits, the serving version and the ready
replicas all come from caches. `connection_opened` (a `connection_created` receiver) marks the
request's context when its ORM thread connects (asgiref carries context variables set in a
sync_to_async thread back to the caller), so `release_db_connection` hops to the ORM thread
only when there is something to give back: no thread hop per request on the hot path.
"""
from __future__ import annotations

from contextvars import ContextVar
from typing import Awaitable, Callable, Hashable, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from common.ttl_cache import TtlCache
from llm_platform.db_watchdog import query_timeout

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

_opened: ContextVar[bool] = ContextVar("db_connection_opened", default=False)


def connection_opened(sender, connection, **kwargs) -> None:
    """`connection_created` receiver (inference/apps.py)."""
    _opened.set(True)


def _release() -> None:
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:  # never end a transaction someone is inside
            connection.close()


async def release_db_connection() -> None:
    """Runs on the request's ORM thread (thread-sensitive), where its connection lives; a
    request that opened none since its last release skips the hop."""
    if not _opened.get():
        return
    _opened.set(False)
    await sync_to_async(_release)()


def off_request(load: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """`load` as a cache's background reload runs it (common.ttl_cache: in a context of its
    own, so on asgiref's one thread for thread-sensitive code outside a request): its queries
    bounded by DB_QUERY_TIMEOUT_SECONDS as a request's are, and its connection given back to
    the pool as soon as it is done rather than held by that thread."""

    async def reload(*args) -> T:
        try:
            with query_timeout(settings.DB_QUERY_TIMEOUT_SECONDS):
                return await load(*args)
        finally:  # always: the thread may hold a connection another caller opened there
            _opened.set(False)
            await sync_to_async(_release)()

    return reload


def registry_cache(load: Callable[[K], Awaitable[T]], clock: Callable[[], float],
                   ttl_s: float) -> TtlCache[K, T]:
    """The request path's cache of a registry read (serving versions, ready replicas, live
    rollouts): reloaded in the background (`off_request`) once three quarters of its TTL have
    passed (REGISTRY_CACHE_REFRESH_AHEAD), so no request waits for PostgreSQL, and read by one
    request at a time when a burst finds it expired (the others get the held value while that
    read runs, up to one TTL past its expiry).
    A reload costs this process 1.3-3.2 ms of CPU (the ORM, psycopg, the thread hop; measured
    on a 2-vCPU Zen 4): ~1.3 per key and second at a 1 s TTL, a fixed cost per second, not
    per request; the last quarter (250 ms at 1 s) is the reload's time to land."""
    if not settings.REGISTRY_CACHE_REFRESH_AHEAD or ttl_s <= 0:
        return TtlCache(load, clock, ttl_s)
    return TtlCache(load, clock, ttl_s, refresh_after_s=ttl_s * 0.75, refresh=off_request(load),
                    stale_while_loading_s=ttl_s)
