"""Reads on tenants: the effective limits and scheduling class of a tenant.

`LimitsCache` keeps each tenant's `Limits` in Redis for `ttl_seconds`, so an edit in the admin
reaches every platform process within that time without a restart; each process also keeps
them in memory until `ttl_seconds` after they were written to Redis (no round trip per
request, the same bound).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Callable

from common.ttl_cache import TtlCache

from tenants.models import Tenant
from common import redis_keys


@dataclass(frozen=True)
class Limits:
    """A tenant's effective limits: the tenant's overrides, else its tier's defaults."""

    tenant_id: int
    tier_name: str
    priority: int  # lower is served first (same convention as the replica's `priority`)
    requests_per_minute: int
    tokens_per_minute: int
    request_burst: int  # bucket capacities
    token_burst: int
    max_queue_wait_ms: int

    @property
    def suspended(self) -> bool:
        """A limit of 0 (per minute, or a bucket's capacity): the buckets can never admit a
        request, so none is checked against them; the request path refuses it outright."""
        return min(self.requests_per_minute, self.tokens_per_minute, self.request_burst,
                   self.token_burst) <= 0


def _pick(*values: int | None) -> int:
    return next(v for v in values if v is not None)


def limits_from_tenant(tenant: Tenant) -> Limits:
    tier = tenant.tier
    rpm = _pick(tenant.requests_per_minute, tier.requests_per_minute)
    tpm = _pick(tenant.tokens_per_minute, tier.tokens_per_minute)
    return Limits(
        tenant_id=tenant.pk,
        tier_name=tier.name,
        priority=tier.priority,
        requests_per_minute=rpm,
        tokens_per_minute=tpm,
        # A tenant's own per-minute override without its own burst scales with that override.
        request_burst=_pick(tenant.request_burst,
                            tier.request_burst if tenant.requests_per_minute is None else None,
                            rpm),
        token_burst=_pick(tenant.token_burst,
                          tier.token_burst if tenant.tokens_per_minute is None else None,
                          tpm),
        max_queue_wait_ms=tier.max_queue_wait_ms,
    )


async def tenant_limits(tenant_id: int) -> Limits:
    tenant = await Tenant.objects.select_related("tier").aget(pk=tenant_id)
    return limits_from_tenant(tenant)


class LimitsCache:
    """`tenant_limits` shared through Redis for `ttl_seconds` (0 = always read PostgreSQL)."""

    def __init__(self, redis, key_prefix: str, ttl_seconds: float,
                 clock: Callable[[], float] = time.time):
        self._redis = redis
        self._prefix = key_prefix
        self._ttl = ttl_seconds
        self._clock = clock
        # In memory until ttl_seconds after the Redis entry was written (wall clock).
        # A burst finding it expired reads it once (common.ttl_cache).
        self._local: TtlCache[int, tuple[Limits, float]] = TtlCache(
            self._load, clock, ttl_seconds, stamp=lambda entry: entry[1],
            stale_while_loading_s=ttl_seconds)

    def key(self, tenant_id: int) -> str:
        return redis_keys.tenant_limits(self._prefix, tenant_id)

    async def get(self, tenant_id: int) -> Limits:
        if self._ttl <= 0:
            return await tenant_limits(tenant_id)
        return (await self._local.get(tenant_id))[0]

    async def _load(self, tenant_id: int) -> tuple[Limits, float]:
        cached = await self._redis.get(self.key(tenant_id))
        if cached is not None:
            data = json.loads(cached)
            written_at = float(data.pop("at", 0.0))
            return Limits(**data), written_at
        limits = await tenant_limits(tenant_id)
        written_at = self._clock()  # the stamp's clock is the one the in-memory TTL runs on
        await self._redis.set(self.key(tenant_id),
                              json.dumps({**asdict(limits), "at": written_at}),
                              px=max(1, int(self._ttl * 1000)))
        return limits, written_at
