"""Wake-ups for the admission queue's waiters: one Redis pub/sub connection per process.

The queue's Lua `pump` PUBLISHes the ticket of every waiter it hands a slot to on one channel;
each process listens with a single subscription while any of its requests waits and sets that
ticket's event. Before, every waiter blocked on its own wake list (BLPOP), which held one
pooled connection per waiting request: a burst of a few hundred waiters emptied the pool and
the requests finishing (releasing slots, settling quotas) got `Too many connections`.

Invariants: a waiter that has to wait subscribes (`expect`) and then polls once at once, so a
wake-up published for it before the subscription is seen by that poll and none after it is
missed while the subscription is healthy; a lost one (a dropped connection) is covered by the
waiter's fallback poll. The listener runs only while
some ticket is expected and then lets its connection go.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import AsyncIterator

logger = logging.getLogger(__name__)

# How long the listener blocks for a message before it checks whether anyone still waits.
_LISTEN_S = 0.25


class WakeUps:
    def __init__(self, redis, channel: str, subscribe_timeout_s: float = 1.0):
        self._redis = redis
        self.channel = channel
        self._subscribe_timeout_s = subscribe_timeout_s
        self._events: dict[str, asyncio.Event] = {}
        self._task: asyncio.Task | None = None
        self._subscribed: asyncio.Future | None = None

    @contextlib.asynccontextmanager
    async def expect(self, ticket: str) -> AsyncIterator[asyncio.Event]:
        """An event set when `ticket` is woken; subscribed (best effort, bounded) on entry."""
        event = self._events[ticket] = asyncio.Event()
        try:
            if self._task is None:
                self._subscribed = asyncio.get_running_loop().create_future()
                self._task = asyncio.create_task(self._listen(self._subscribed))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._subscribed),
                                       self._subscribe_timeout_s)
            yield event
        finally:
            self._events.pop(ticket, None)

    async def wait(self, ticket: str, timeout_s: float) -> bool:
        event = self._events.get(ticket)
        if event is None:
            await asyncio.sleep(timeout_s)
            return False
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except asyncio.TimeoutError:
            return False
        event.clear()
        return True

    async def _listen(self, subscribed: asyncio.Future) -> None:
        try:
            while self._events:
                try:
                    await self._listen_once(subscribed)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - Redis down: waiters poll instead
                    logger.warning("admission wake-up subscription failed: %s", exc)
                    await asyncio.sleep(_LISTEN_S)
        finally:
            self._task = None  # before any await: a new waiter starts a new listener
            if not subscribed.done():
                subscribed.set_result(False)

    async def _listen_once(self, subscribed: asyncio.Future) -> None:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(self.channel)
            if not subscribed.done():
                subscribed.set_result(True)
            while self._events:
                message = await pubsub.get_message(timeout=_LISTEN_S)
                if message is None or message.get("type") != "message":
                    continue
                ticket = message["data"]
                event = self._events.get(ticket.decode() if isinstance(ticket, bytes) else ticket)
                if event is not None:
                    event.set()
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(pubsub.aclose())

    async def close(self) -> None:
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
