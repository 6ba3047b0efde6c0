"""Every Redis client of the platform, built one way: bounded in time and in connections.

- `socket_connect_timeout` / `socket_timeout` (REDIS_CONNECT_TIMEOUT_SECONDS,
  REDIS_SOCKET_TIMEOUT_SECONDS): Redis down or hung (SIGSTOP, a partition) fails a command
  within seconds with `redis.ConnectionError` / `redis.TimeoutError` (both `RedisError`),
  which the API answers as 503 with Retry-After (inference/views/errors.py). Blocking commands
  must block for less than the socket timeout.
- A blocking pool (REDIS_POOL_MAX_SIZE connections per pool): a burst waits up to
  REDIS_POOL_TIMEOUT_SECONDS for a free connection instead of failing at once with
  `MaxConnectionsError: Too many connections` (redis-py's default pool raises at 100).
- One retry on a connection error, none on a timeout: a connection that died while idle (Redis
  restarted) is replaced transparently, so service comes back by itself when Redis does; a hung
  Redis costs one socket timeout, not several.
- The asyncio client's plain pipelines (`pipeline(transaction=False)`: the request path's
  admission, lease and end round trips) and EVALSHA calls (the token buckets) go over one
  auto-pipelined connection of its own (common/lean_redis.py: the same commands, replies and
  errors, a fraction of redis-py's CPU per round trip) with the same timeouts and retry;
  REDIS_LEAN_PIPELINES=0 sends them through redis-py. A loop iteration's batches go out in
  groups of REDIS_LEAN_FLUSH_BATCHES as they are queued (the rest at its end).
"""
from __future__ import annotations

import functools

import redis
import redis.asyncio as aioredis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.driver_info import DriverInfo
from redis.utils import get_lib_version

from common.lean_redis import LeanRedis


@functools.cache
def driver_info() -> DriverInfo:
    """What every connection tells Redis it is (CLIENT SETINFO), resolved once: left to
    redis-py, each new connection looked its version up in the installed packages' metadata
    (`importlib.metadata.version`: a scan of site-packages, ~5 ms of CPU here), which a fresh
    API process paid for every connection its pools opened under its first requests
    (benchmarks/README.md, round frontdoor11)."""
    return DriverInfo(lib_version=get_lib_version())


def connection_options() -> dict:
    """Keyword arguments for any redis-py pool or client (sync or asyncio)."""
    return {
        "socket_timeout": settings.REDIS_SOCKET_TIMEOUT_SECONDS,
        "socket_connect_timeout": settings.REDIS_CONNECT_TIMEOUT_SECONDS,
        "health_check_interval": 30,
        "driver_info": driver_info(),
    }


def async_redis(url: str | None = None, max_connections: int | None = None) -> aioredis.Redis:
    """An asyncio client owning its own blocking pool (belongs to the running event loop)."""
    from redis.asyncio.retry import Retry

    pool = aioredis.BlockingConnectionPool.from_url(
        url or settings.REDIS_URL,
        max_connections=max_connections or settings.REDIS_POOL_MAX_SIZE,
        timeout=settings.REDIS_POOL_TIMEOUT_SECONDS,
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        **connection_options())
    if settings.REDIS_LEAN_PIPELINES:
        return LeanRedis.on_pool(pool, settings.REDIS_LEAN_FLUSH_BATCHES)
    return aioredis.Redis.from_pool(pool)


def sync_redis(url: str | None = None, max_connections: int | None = None) -> redis.Redis:
    """A synchronous client owning its own blocking pool (Celery tasks, admin, commands)."""
    from redis.retry import Retry

    pool = redis.BlockingConnectionPool.from_url(
        url or settings.REDIS_URL,
        max_connections=max_connections or settings.REDIS_POOL_MAX_SIZE,
        timeout=settings.REDIS_POOL_TIMEOUT_SECONDS,
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        **connection_options())
    return redis.Redis.from_pool(pool)
