"""Counts of canary requests that stable served instead, per rollout and minute, in Redis.

A request routed to the canary that falls back to stable is billed (one usage row) to stable,
so the usage rows alone would hide a canary that fails. The request path counts each fallback
here; the evaluator adds them to the canary's attempts.

Key: `{prefix}rollout:{rollout_id}:fallbacks`, a hash of `{reason}:{epoch minute}` -> count,
expiring a day after its last write. Reasons: `failed` (a canary replica failed before the
first token: an error of the canary) and `unavailable` (no ready canary replica, or its queue
was full: capacity, not an error).
"""
from __future__ import annotations

from typing import Callable
from common import redis_keys

FAILED = "failed"
UNAVAILABLE = "unavailable"
REASONS = (FAILED, UNAVAILABLE)
TTL_S = 86_400


def fallbacks_key(prefix: str, rollout_id: int) -> str:
    return redis_keys.canary_fallbacks(prefix, rollout_id)


class FallbackRecorder:
    """The request path's side (redis.asyncio client, wall clock injected)."""

    def __init__(self, redis, key_prefix: str, clock: Callable[[], float]):
        self._redis = redis
        self._prefix = key_prefix
        self._clock = clock

    async def record(self, rollout_id: int, reason: str) -> None:
        key = fallbacks_key(self._prefix, rollout_id)
        minute = int(self._clock() // 60)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hincrby(key, f"{reason}:{minute}", 1)
            pipe.expire(key, TTL_S)
            await pipe.execute()


def count_fallbacks(redis, key_prefix: str, rollout_id: int, since: float,
                    until: float) -> dict[str, int]:
    """The evaluator's side (synchronous redis client): fallbacks per reason in the minutes
    overlapping [since, until) (minute granularity: a window edge may count a minute more)."""
    raw = redis.hgetall(fallbacks_key(key_prefix, rollout_id))
    counts = {reason: 0 for reason in REASONS}
    first, last = int(since // 60), int(until // 60)
    for field, value in raw.items():
        reason, _, minute = (field.decode() if isinstance(field, bytes) else field).partition(":")
        if reason in counts and minute.isdigit() and first <= int(minute) <= last:
            counts[reason] += int(value)
    return counts
