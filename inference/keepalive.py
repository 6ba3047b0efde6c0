"""Keeping a running request's leases alive: its admission slot, its outstanding-token lease
on the replica and its pending Idempotency-Key all expire in Redis unless refreshed.

`KeepAlive` refreshes whatever the request holds every `interval_s` while the request runs
(the holdings change: a retry takes a new lease). A refresh that fails (Redis down, hung) is
logged and tried again on the next tick; if Redis stays away longer than a lease's TTL, the
lease expires and Redis reclaims it, which is what must happen when the holder is gone anyway.
Invariant: `interval_s` is well below every TTL refreshed (a third or less), so one failed
tick never loses a live lease; nothing is refreshed past `max_s` (a request that was never
closed cannot keep its leases for ever).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Awaitable, Callable

logger = logging.getLogger(__name__)

Refresh = Callable[[], Awaitable[object]]


class KeepAlive:
    def __init__(self, interval_s: float, timeout_s: float, max_s: float):
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._max_s = max_s
        self._holdings: dict[str, Refresh] = {}
        self._task: asyncio.Task | None = None

    def hold(self, name: str, refresh: Refresh) -> None:
        self._holdings[name] = refresh
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    def drop(self, name: str) -> None:
        self._holdings.pop(name, None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + self._max_s
        while loop.time() < end:
            await asyncio.sleep(self._interval_s)
            for name, refresh in list(self._holdings.items()):
                try:
                    await asyncio.wait_for(refresh(), self._timeout_s)
                except Exception as exc:  # noqa: BLE001 - next tick retries; TTL is the bound
                    logger.warning("could not refresh %s: %r", name, exc)

    async def stop(self) -> None:
        self._holdings.clear()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
