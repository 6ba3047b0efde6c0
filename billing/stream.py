"""The usage stream in Redis: its key names and the request path's publisher.

Invariant: `UsageRecorder.record` returns only once the event is either in the stream (XADD
acknowledged by Redis) or fsynced to the local outbox. It never raises for Redis trouble.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable

import redis
import redis.asyncio as aioredis
from django.apps import apps
from django.conf import settings

from billing.events import UsageEvent
from billing.leases import UsageLease
from billing.outbox import FileOutbox
from common import redis_keys

logger = logging.getLogger(__name__)

GROUP = "billing"
FIELD = "e"  # one field per entry: the event's JSON

# KEYS: the stream, the request's usage lease. ARGV: the field, the event's JSON. The lease is
# deleted only once the event is in the stream: a refused XADD (e.g. Redis out of memory)
# stops the script before the DEL.
_FINAL = """
redis.call('XADD', KEYS[1], '*', ARGV[1], ARGV[2])
return redis.call('DEL', KEYS[2])
"""


@dataclass(frozen=True)
class StreamKeys:
    prefix: str

    @property
    def stream(self) -> str:
        return redis_keys.usage_stream(self.prefix)

    @property
    def dead_letters(self) -> str:
        """Entries PostgreSQL refused (e.g. an unknown tenant): kept for a human, not retried."""
        return redis_keys.usage_dead_letters(self.prefix)


class UsageRecorder:
    """Appends usage events to the stream; falls back to the outbox when Redis fails."""

    def __init__(self, client: aioredis.Redis, keys: StreamKeys, outbox: FileOutbox,
                 clock: Callable[[], float], retry_after_s: float = 1.0):
        self.client = client
        self.keys = keys
        self.outbox = outbox
        self.clock = clock
        # After a failure, Redis is not tried again for this long: while it is down (or
        # unresponsive, which costs a whole timeout per try) requests go straight to the outbox.
        self.retry_after_s = retry_after_s
        self._down_until = float("-inf")
        self._final = None  # the _FINAL script, registered on first use

    async def record(self, event: UsageEvent, lease: UsageLease | None = None) -> None:
        """`lease`: the request's usage lease, set in the same round trip just before the
        event (a request's first, pending event); set on its own while Redis is marked down."""
        now = self.clock()
        event = event.stamped(now)
        if now >= self._down_until:
            try:
                if lease is None:
                    await self.client.xadd(self.keys.stream, {FIELD: event.to_json()})
                else:
                    pipe = self.client.pipeline(transaction=False)
                    lease.queue_set(pipe)
                    pipe.execute_command("XADD", self.keys.stream, "*", FIELD, event.to_json())
                    await pipe.execute()
                return
            except (redis.RedisError, OSError) as exc:
                self._down_until = self.clock() + self.retry_after_s
                logger.warning("usage stream unavailable (%s); events go to the outbox for "
                               "%.1f s", exc, self.retry_after_s)
        if lease is not None:
            await lease.set()
        await asyncio.to_thread(self.outbox.append, [event])

    def queue_pending(self, pipe, event: UsageEvent, lease: UsageLease):
        """A request's first (pending) event and its usage lease queued on another call's
        pipeline (the admission slot's: one round trip for the three). Returns `finish`, to
        await with the results of what was queued (or with the exception that failed the
        pipeline): on a failure the event goes to the outbox, as `record` would; either way
        the lease is then kept alive."""
        now = self.clock()
        event = event.stamped(now)
        queued = now >= self._down_until
        if queued:
            lease.queue_set(pipe)
            pipe.execute_command("XADD", self.keys.stream, "*", FIELD, event.to_json())

        async def finish(results: list) -> None:
            failure = next((r for r in results if isinstance(r, BaseException)), None)
            if queued and failure is None:
                lease.keep()
                return
            if failure is not None:
                self._down_until = self.clock() + self.retry_after_s
                logger.warning("usage stream unavailable (%s); events go to the outbox for "
                               "%.1f s", failure, self.retry_after_s)
            await lease.set()
            lease.keep()
            await asyncio.to_thread(self.outbox.append, [event])
        return finish

    def queue_final(self, batch, event: UsageEvent, lease: UsageLease):
        """A request's final event and the end of its usage lease, queued on a
        `common.pipelines.Batch` with the rest of the request's end (one round trip). Returns
        the batch's `finish`: when the event did not reach the stream it goes to the outbox,
        as `record` would, and then the lease is released; if even the outbox fails, the
        lease expires and the reaper finalises the row."""
        now = self.clock()
        event = event.stamped(now)
        lease.abandon()
        queued = now >= self._down_until
        if queued:
            if self._final is None:
                self._final = self.client.register_script(_FINAL)
            batch.script(self._final, [self.keys.stream, lease.key], [FIELD, event.to_json()])

        async def finish(results: list) -> None:
            if queued and not isinstance(results[0], BaseException):
                return
            if queued:
                self._down_until = self.clock() + self.retry_after_s
                logger.warning("usage stream unavailable (%s); events go to the outbox for "
                               "%.1f s", results[0], self.retry_after_s)
            try:
                await asyncio.to_thread(self.outbox.append, [event])
            except Exception:  # noqa: BLE001 - the lease expires and the reaper finalises
                logger.exception("usage for %s was not recorded", event.request_id)
                return
            await lease.release()
        return finish

    async def close(self) -> None:
        await self.client.aclose()


def send_batch(client: redis.Redis, keys: StreamKeys, events: list[UsageEvent]) -> None:
    """XADD a batch in one round trip (the outbox replay); raises if Redis fails."""
    pipe = client.pipeline(transaction=False)
    for event in events:
        pipe.xadd(keys.stream, {FIELD: event.to_json()})
    pipe.execute()


def build_recorder() -> UsageRecorder:
    timeout = settings.USAGE_STREAM_TIMEOUT_SECONDS
    client = aioredis.Redis.from_url(settings.REDIS_URL, socket_timeout=timeout,
                                     socket_connect_timeout=timeout)
    return UsageRecorder(client, StreamKeys(settings.REDIS_KEY_PREFIX),
                         FileOutbox(settings.BILLING_OUTBOX_DIR), time.time,
                         settings.USAGE_STREAM_RETRY_SECONDS)


async def close_loop_recorder(loop) -> None:
    recorder = apps.get_app_config("billing").recorders.pop(loop, None)
    if recorder is not None:
        await recorder.close()
