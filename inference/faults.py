"""Failures of what the platform depends on, as the API errors a client sees.

Redis down or hung (a connection or read timeout, an exhausted pool) and PostgreSQL down (or
its pool exhausted) are 503 with Retry-After: the client retries and service comes back by
itself when the dependency does. A request past its deadline is 504. Used by the HTTP views,
the SSE relay (as the stream's error event) and the WebSocket consumer (as an error frame).
"""
from __future__ import annotations

import asyncio
import logging

from django.db import DatabaseError, InterfaceError, OperationalError
from redis.exceptions import RedisError

from inference.errors import ApiError, DeadlineExceeded, ServiceUnavailable
from llm_platform.hot_settings import settings

logger = logging.getLogger(__name__)


def _retry_after() -> dict[str, str]:
    return {"Retry-After": str(settings.DEPENDENCY_RETRY_AFTER_SECONDS)}


def deadline_exceeded() -> DeadlineExceeded:
    return DeadlineExceeded(
        f"The request did not finish within {settings.REQUEST_DEADLINE_SECONDS:g} s; retry "
        "later or ask for fewer tokens.", headers={"Retry-After": "1"})


def as_api_error(exc: BaseException, where: str = "") -> ApiError:
    """The ApiError a client gets for `exc`; anything unexpected is logged and answered as a
    500 JSON error (never an HTML page, never silence)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RedisError):
        logger.warning("Redis unavailable%s: %r", f" in {where}" if where else "", exc)
        return ServiceUnavailable("The platform's Redis is busy or unreachable; retry shortly.",
                                  code="redis_unavailable", headers=_retry_after())
    if isinstance(exc, (OperationalError, InterfaceError)) or (
            isinstance(exc, DatabaseError) and "connection" in str(exc).lower()):
        logger.warning("database unavailable%s: %r", f" in {where}" if where else "", exc)
        return ServiceUnavailable("The platform's database is busy or unreachable; retry "
                                  "shortly.", code="database_unavailable",
                                  headers=_retry_after())
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return deadline_exceeded()
    logger.error("unhandled error%s", f" in {where}" if where else "", exc_info=exc)
    return ApiError("Internal error.")


class preparing:
    """Bounds everything before generation (authentication, limits, catalogue, tokenizer,
    idempotency, quota: reads of PostgreSQL and Redis) by REQUEST_PREPARE_TIMEOUT_SECONDS: a
    hung PostgreSQL (which, unlike Redis, has no read timeout) answers 503 in seconds instead
    of holding the client until the request deadline; past the request's `deadline` it is 504.
    A TimeoutError the body raises itself is answered the same way. The thread stuck in the
    driver stays stuck until PostgreSQL answers again; the client does not wait for it.

    `async with preparing(deadline):`. A class rather than a generator context manager: every
    request enters one before its first token, and a generator's frame, its `anext` and
    `athrow` cost a few microseconds more than two plain calls."""

    __slots__ = ("_deadline", "_loop", "_timeout")

    def __init__(self, deadline: float):
        self._deadline = deadline

    async def __aenter__(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        timeout = self._timeout = asyncio.timeout_at(
            min(self._deadline, loop.time() + settings.REQUEST_PREPARE_TIMEOUT_SECONDS))
        await timeout.__aenter__()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        try:
            await self._timeout.__aexit__(exc_type, exc, tb)
        except TimeoutError:
            pass  # the bound ran out while the body ran: answered below
        else:
            if exc_type is None or not issubclass(exc_type, TimeoutError):
                return  # the body's own outcome (its exception propagates unchanged)
        if self._loop.time() >= self._deadline:
            raise deadline_exceeded() from None
        logger.warning("request preparation took over %ss (database or Redis hung?)",
                       settings.REQUEST_PREPARE_TIMEOUT_SECONDS)
        raise ServiceUnavailable(
            "The platform could not read its state in time (its database or Redis is slow "
            "or unreachable); retry shortly.", code="dependency_timeout",
            headers=_retry_after()) from None
