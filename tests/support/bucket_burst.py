"""A platform process's share of a concurrent burst on one tenant's buckets (the Lua check),
run in child processes by tests/platform/test_buckets.py.

The children are spawned, not forked: the test process holds grpc's threads (other tests' Triton
calls), and a fork with them running can crash the child before it does anything (grpc's
at-fork handlers). A spawned child starts a fresh interpreter, sets Django up from the
inherited DJANGO_SETTINGS_MODULE (the models behind `Limits` need it) and gets the limits as
plain fields.
"""
from __future__ import annotations

import asyncio
import time


async def _burst(redis_url: str, prefix: str, limits, costs: list[int]) -> list[int]:
    import redis.asyncio as aioredis

    from tenants.buckets import TokenBuckets

    redis = aioredis.Redis.from_url(redis_url)
    try:
        buckets = TokenBuckets(redis, prefix, time.time)
        states = await asyncio.gather(*(buckets.check(limits, cost) for cost in costs))
        return [cost for cost, state in zip(costs, states) if state.admitted]
    finally:
        await redis.aclose()


def run_burst(redis_url: str, prefix: str, limits: dict, costs: list[int], ready, start,
              results):
    """Say it is ready, wait for the shared start event, fire every check at once, report the
    admitted costs. `limits`: the fields of a `tenants.selectors.Limits`."""
    import django

    django.setup()
    from tenants.selectors import Limits

    ready.put(True)
    start.wait()
    results.put(asyncio.run(_burst(redis_url, prefix, Limits(**limits), costs)))
