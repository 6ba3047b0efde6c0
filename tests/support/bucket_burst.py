"""A platform process's share of a concurrent burst on one tenant's buckets (the Lua check),
run in child processes by tests/platform/test_buckets.py."""
from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from tenants.buckets import TokenBuckets
from tenants.selectors import Limits


async def _burst(redis_url: str, prefix: str, limits: Limits, costs: list[int]) -> list[int]:
    redis = aioredis.Redis.from_url(redis_url)
    try:
        buckets = TokenBuckets(redis, prefix, time.time)
        states = await asyncio.gather(*(buckets.check(limits, cost) for cost in costs))
        return [cost for cost, state in zip(costs, states) if state.admitted]
    finally:
        await redis.aclose()


def run_burst(redis_url: str, prefix: str, limits: Limits, costs: list[int], start, results):
    """Wait for the shared start event, fire every check at once, report the admitted costs."""
    start.wait()
    results.put(asyncio.run(_burst(redis_url, prefix, limits, costs)))
