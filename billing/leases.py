"""Usage leases: a Redis key per request in flight, held by the process serving it.

The request path takes the lease before its pending usage event, refreshes it while it works
and deletes it only after its final usage event is durable. A pending usage row whose lease is
gone therefore belongs to a process that died (SIGKILL, OOM, deploy) or whose final event is
still on its way: the reaper (billing/reaper.py) may finalise it. A lease expires `ttl_s` after
its last refresh; the holder refreshes every `ttl_s / 3`.
"""
from __future__ import annotations

import asyncio
import logging

import redis
import redis.asyncio as aioredis

from common import redis_keys

logger = logging.getLogger(__name__)


def lease_key(prefix: str, request_id: str) -> str:
    return redis_keys.usage_lease(prefix, request_id)


class UsageLease:
    """One request's lease (async: the request path). Redis trouble is logged, never raised:
    a lease that could not be kept at worst lets the reaper finalise from the replica's count,
    which is what the final event would have said."""

    def __init__(self, client: aioredis.Redis, prefix: str, request_id: str, ttl_s: float):
        self.client = client
        self.key = lease_key(prefix, request_id)
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self._keeper: asyncio.Task | None = None  # a refresh in progress
        self._timer: asyncio.TimerHandle | None = None  # the next refresh

    async def hold(self) -> None:
        await self.set()
        self.keep()

    def queue_set(self, pipe) -> None:
        """The lease's SET queued on a pipeline (sent with the pending usage event)."""
        pipe.execute_command("SET", self.key, b"1", "PX", self.ttl_ms)  # set(px=): 25 calls

    def keep(self) -> None:
        """Refresh the lease (already set) every third of its TTL until released: a timer,
        and a refresh task only when one is due (most requests end before the first), as
        inference/keepalive.py keeps a request's other leases."""
        if self._timer is None and self._keeper is None:
            self._timer = asyncio.get_running_loop().call_later(self.ttl_ms / 3000.0,
                                                                self._due)

    def abandon(self) -> None:
        """Stop refreshing; the lease expires on its own (the final event was not recorded:
        the reaper is to finalise the row)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._keeper is not None:
            self._keeper.cancel()
            self._keeper = None

    async def release(self) -> None:
        self.abandon()
        try:
            await self.client.delete(self.key)
        except (redis.RedisError, OSError) as exc:
            logger.warning("usage lease %s not released (%s); it expires", self.key, exc)

    def _due(self) -> None:
        self._timer = None
        self._keeper = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        try:
            await self.set()
        finally:
            if self._keeper is asyncio.current_task():  # not abandoned meanwhile
                self._keeper = None
                self._timer = asyncio.get_running_loop().call_later(self.ttl_ms / 3000.0,
                                                                    self._due)

    async def set(self) -> None:
        try:
            await self.client.set(self.key, b"1", px=self.ttl_ms)
        except (redis.RedisError, OSError) as exc:
            logger.warning("usage lease %s not set (%s)", self.key, exc)


def held_leases(client: redis.Redis, prefix: str, request_ids: list[str]) -> set[str]:
    """The request ids whose lease is held (the reaper's check; raises on Redis trouble, so
    that the reaper does nothing rather than reap requests that are alive)."""
    if not request_ids:
        return set()
    pipe = client.pipeline(transaction=False)
    for request_id in request_ids:
        pipe.exists(lease_key(prefix, request_id))
    return {rid for rid, held in zip(request_ids, pipe.execute()) if held}
