"""Live quota consumption: how much of each tenant's buckets is spent right now (read-only).

Reads the token-bucket hashes `tenants.buckets` keeps in Redis and refills them to `now` the
way the Lua script does, without writing anything. Used by the admin console and the tenant
dashboard; one pipelined round trip for any number of tenants.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from tenants.buckets import bucket_keys, level_now
from tenants.selectors import Limits


@dataclass(frozen=True)
class Consumption:
    limits: Limits
    requests_level: float  # what the bucket holds now (may be below zero after corrections)
    tokens_level: float

    @property
    def requests_used(self) -> float:
        return max(0.0, self.limits.request_burst - self.requests_level)

    @property
    def tokens_used(self) -> float:
        return max(0.0, self.limits.token_burst - self.tokens_level)

    @property
    def requests_percent(self) -> int:
        return _percent(self.requests_used, self.limits.request_burst)

    @property
    def tokens_percent(self) -> int:
        return _percent(self.tokens_used, self.limits.token_burst)


def _percent(used: float, capacity: int) -> int:
    return 0 if capacity <= 0 else min(100, round(100.0 * used / capacity))


def read_consumption(redis_client, key_prefix: str, limits: Iterable[Limits],
                     clock: Callable[[], float]) -> dict[int, Consumption]:
    """tenant id -> Consumption. `redis_client` is a sync client; `clock` gives wall-clock
    seconds (the buckets' timestamps are wall-clock milliseconds)."""
    limits = list(limits)
    pipe = redis_client.pipeline(transaction=False)
    for item in limits:
        for key in bucket_keys(key_prefix, item.tenant_id):
            pipe.hmget(key, "level", "ts")
    replies = pipe.execute() if limits else []
    now_ms = int(clock() * 1000)
    out = {}
    for i, item in enumerate(limits):
        (req_level, req_ts), (tok_level, tok_ts) = replies[2 * i], replies[2 * i + 1]
        out[item.tenant_id] = Consumption(
            limits=item,
            requests_level=level_now(req_level, req_ts, now_ms,
                                     item.requests_per_minute, item.request_burst),
            tokens_level=level_now(tok_level, tok_ts, now_ms,
                                   item.tokens_per_minute, item.token_burst),
        )
    return out


def consumption_for(tenants) -> dict:
    """Live consumption of these Tenant objects from the configured Redis (empty when Redis
    does not answer: pages still render and say the numbers are not available)."""
    import time

    import redis
    from django.conf import settings

    from tenants.selectors import limits_from_tenant

    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1.0)
    try:
        return read_consumption(client, settings.REDIS_KEY_PREFIX,
                                [limits_from_tenant(t) for t in tenants], time.time)
    except redis.RedisError:
        return {}
    finally:
        client.close()
