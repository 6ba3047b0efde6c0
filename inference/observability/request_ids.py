"""Request ids: one per HTTP request, kept from the client's `X-Request-Id` when well formed.

The id names the request everywhere: the `X-Request-Id` response header, error bodies, every
log line (bound as `request_id`), Triton's request id at the replica and the usage row. The usage
row's id is unique, so a client's id is kept only if no other request claimed it within
REQUEST_ID_CLAIM_SECONDS (a Redis SET NX); a reused, malformed or unclaimable id is replaced by a
fresh one (logged with the client's value as `client_request_id`).
"""
from __future__ import annotations

import asyncio
import contextvars
import re

from common import redis_keys
from common.random_ids import random_hex

HEADER = "X-Request-Id"
# What a usage row can hold (64 chars) and a log line or header can carry safely.
WELL_FORMED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")

# A claim waits at most this long for Redis (then the request gets a fresh id: never a hang).
CLAIM_TIMEOUT_S = 0.5

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)


def new_request_id() -> str:
    return random_hex()


def is_well_formed(value: str | None) -> bool:
    return value is not None and WELL_FORMED.fullmatch(value) is not None


def current_request_id() -> str | None:
    """The id of the HTTP request this task serves (None outside one: WebSocket, Celery)."""
    return _current.get()


def set_current_request_id(request_id: str | None) -> contextvars.Token:
    return _current.set(request_id)


def request_id_for_usage() -> str:
    """The id a new generation records: the HTTP request's own, else a fresh one. Invariant:
    unique per generation (the middleware hands each HTTP request a claimed or fresh id and an
    HTTP request runs at most one generation)."""
    return current_request_id() or new_request_id()


async def claim(redis, key_prefix: str, client_value: str | None, ttl_s: int) -> tuple[str, bool]:
    """(the request's id, whether the client's was kept)."""
    if not is_well_formed(client_value):
        return new_request_id(), False
    try:
        kept = await asyncio.wait_for(
            redis.set(redis_keys.request_id_claim(key_prefix, client_value), 1, nx=True, ex=ttl_s), CLAIM_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - Redis down or slow: a fresh id is always safe
        kept = False
    return (client_value, True) if kept else (new_request_id(), False)
