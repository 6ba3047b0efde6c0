"""API-key authentication: an in-process cache in front of a short shared cache in Redis.

`KeyAuthenticator` (one per API process and event loop) answers a key it saw recently without
any round trip: its in-process `TtlCache` reuses an entry until `cache_seconds` after the entry
was written to Redis (the stamp travels in the entry), so the two caches never add their TTLs.
Revocation through `tenants.services.revoke_api_key` deletes the Redis entry and PUBLISHes the
key's hash; every process listens on that channel and drops its entry. The in-process cache is
used only while that subscription is live (it is cleared whenever the subscription is
(re)made, since messages may have been missed); without it every request reads Redis, as
before.

Invariants: a key revoked in the database stops authenticating within `cache_seconds` (the
cache entry's TTL), or at once (one pub/sub delivery) when revoked through
`tenants.services.revoke_api_key`. A
well-formed key that matches nothing costs one database query, then is refused from Redis for
`negative_seconds` (an entry keyed by its hash, never the key itself): a flood of one bogus key
never reaches PostgreSQL. A new key is random, so no refusal can be cached for it in advance;
a key of a deactivated tenant works again within `negative_seconds` of reactivation.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import time
from dataclasses import asdict, dataclass
from typing import Callable

from django.utils import timezone

from common.ttl_cache import TtlCache

from tenants.keys import hash_key, hashes_match, prefix_of
from tenants.models import ApiKey
from common import redis_keys


@dataclass(frozen=True)
class Principal:
    """Who is calling: what the request path needs about the tenant and its key."""

    tenant_id: int
    tenant_name: str
    api_key_id: int
    key_prefix: str
    priority: int
    tier_name: str


class AuthenticationFailed(Exception):
    pass


logger = logging.getLogger(__name__)


def cache_key(prefix: str, key_hash: str) -> str:
    return redis_keys.api_key_cache(prefix, key_hash)


def refusal_key(prefix: str, key_hash: str) -> str:
    return redis_keys.api_key_refused(prefix, key_hash)


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


async def authenticate(raw_key: str | None, redis, key_prefix: str, cache_seconds: float,
                       negative_seconds: float = 60.0) -> Principal:
    """The principal for a presented key, or AuthenticationFailed.

    `redis` is an asyncio Redis client (injected). Misses read PostgreSQL once and cache the
    result for `cache_seconds`; a refusal is cached for `negative_seconds` (0: not cached).
    """
    return (await _authenticate(raw_key, redis, key_prefix, cache_seconds,
                                negative_seconds))[0]


async def _authenticate(raw_key: str | None, redis, key_prefix: str, cache_seconds: float,
                        negative_seconds: float) -> tuple[Principal, float]:
    """(principal, wall-clock time its Redis entry was written)."""
    if not raw_key or prefix_of(raw_key) is None:
        raise AuthenticationFailed("Invalid API key.")
    digest = hash_key(raw_key)
    ckey, rkey = cache_key(key_prefix, digest), refusal_key(key_prefix, digest)
    cached, refused = await redis.mget(ckey, rkey)
    if refused is not None:
        raise AuthenticationFailed("Invalid API key.")
    if cached is not None:
        data = json.loads(cached)
        stored_hash = data.pop("key_hash")
        written_at = float(data.pop("at", 0.0))
        if hashes_match(stored_hash, raw_key):
            return Principal(**data), written_at
    try:
        principal, stored_hash = await _load_from_database(raw_key)
    except AuthenticationFailed:
        if negative_seconds > 0:
            await redis.set(rkey, b"1", px=max(1, int(negative_seconds * 1000)))
        raise
    written_at = time.time()
    payload = {**asdict(principal), "key_hash": stored_hash, "at": written_at}
    await redis.set(ckey, json.dumps(payload), px=max(1, int(cache_seconds * 1000)))
    return principal, written_at


# The raw key the caller presented, for the cache's load (which runs in the caller's task): the
# cache holds only digests, never a key.
_presented: contextvars.ContextVar[str] = contextvars.ContextVar("presented_api_key")

# How long the invalidation listener blocks for a message before it looks at its state, and
# waits before subscribing again after a failure.
_LISTEN_S = 1.0
_RESUBSCRIBE_S = 0.5


class KeyAuthenticator:
    """`authenticate` with an in-process cache (see the module's docstring): a key seen in the
    last `cache_seconds` costs no round trip. `clock`: wall-clock seconds (entries are stamped
    with the time they were written to Redis, by any process)."""

    def __init__(self, redis, key_prefix: str, cache_seconds: float, negative_seconds: float,
                 clock: Callable[[], float] = time.time):
        self._redis = redis
        self._prefix = key_prefix
        self._cache_seconds = cache_seconds
        self._negative_seconds = negative_seconds
        self.channel = redis_keys.auth_changes(key_prefix)
        # A burst finding an entry expired reads Redis once (common.ttl_cache); a revoked key
        # is forgotten at once (the invalidation below), never served stale.
        self._local: TtlCache[str, tuple[Principal, float]] = TtlCache(
            self._load, clock, cache_seconds, stamp=lambda entry: entry[1],
            stale_while_loading_s=cache_seconds)
        self._reads: dict[str, asyncio.Future] = {}  # digest -> the shared read in flight
        self._live = False  # the invalidation subscription is up: the local cache may be used
        self._task: asyncio.Task | None = None

    async def _load(self, digest: str) -> tuple[Principal, float]:
        """The key's entry, read once for every caller loading it at the same time: a burst
        that finds a key absent (a process just started, or its subscription not yet up) read
        it once per request before, each read checking out a connection of its own (72 reads
        in a fresh process's first 128 requests: benchmarks/README.md, round frontdoor11).

        The first caller reads it in its own task, as before: a database read on a Redis miss
        then runs on that request's ORM thread and is given back with the request's other
        connections (inference/db_connection.py marks the request's own context; a read in a
        task of its own left that mark in the task's context, so the connection was never given
        back, and a burst of new keys drained the pool). The others wait for its answer (they
        hold no database connection then: the request path authenticates before it opens one);
        a first caller that leaves hands the read to the next one."""
        while True:
            shared = self._reads.get(digest)
            if shared is None:
                break
            try:
                return await asyncio.shield(shared)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not shared.cancelled() or (task is not None and task.cancelling()):
                    raise  # this caller is cancelled, not the one reading
        shared = self._reads[digest] = asyncio.get_running_loop().create_future()
        try:
            entry = await _authenticate(_presented.get(), self._redis, self._prefix,
                                        self._cache_seconds, self._negative_seconds)
        except asyncio.CancelledError:
            shared.cancel()  # the next waiter reads it
            raise
        except BaseException as exc:
            shared.set_exception(exc)
            shared.exception()  # retrieved: nobody may be waiting
            raise
        else:
            shared.set_result(entry)
            return entry
        finally:
            if self._reads.get(digest) is shared:
                del self._reads[digest]

    async def authenticate(self, raw_key: str | None) -> Principal:
        if not raw_key or prefix_of(raw_key) is None:
            raise AuthenticationFailed("Invalid API key.")
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._listen())
        digest = hash_key(raw_key)
        if not self._live:
            self._local.clear()
        token = _presented.set(raw_key)
        try:
            return (await self._local.get(digest))[0]
        finally:
            _presented.reset(token)

    @property
    def live(self) -> bool:
        """The in-process cache is in use (its invalidation subscription is up)."""
        return self._live

    def forget(self, digest: str) -> None:
        self._local.forget(digest)

    async def _listen(self) -> None:
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                self._local.clear()  # whatever was published while unsubscribed is lost
                self._live = True
                while True:
                    message = await pubsub.get_message(timeout=_LISTEN_S)
                    if message is not None and message.get("type") == "message":
                        data = message["data"]
                        self.forget(data.decode() if isinstance(data, bytes) else data)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis away: no local cache until back
                logger.warning("API key invalidation subscription failed: %r", exc)
            finally:
                self._live = False
                self._local.clear()
                with contextlib.suppress(Exception):
                    await asyncio.shield(pubsub.aclose())
            await asyncio.sleep(_RESUBSCRIBE_S)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def _load_from_database(raw_key: str) -> tuple[Principal, str]:
    prefix = prefix_of(raw_key)
    api_key = (
        await ApiKey.objects.select_related("tenant__tier")
        .filter(prefix=prefix, revoked_at__isnull=True, tenant__is_active=True)
        .afirst()
    )
    # Compare even when nothing was found so the timing does not say whether the prefix exists.
    stored_hash = api_key.key_hash if api_key is not None else "0" * 64
    if not hashes_match(stored_hash, raw_key) or api_key is None:
        raise AuthenticationFailed("Invalid API key.")
    await ApiKey.objects.filter(pk=api_key.pk).aupdate(last_used_at=timezone.now())
    tenant = api_key.tenant
    principal = Principal(
        tenant_id=tenant.pk,
        tenant_name=tenant.name,
        api_key_id=api_key.pk,
        key_prefix=api_key.prefix,
        priority=tenant.tier.priority,
        tier_name=tenant.tier.name,
    )
    return principal, api_key.key_hash
