"""Keeping a running request's leases alive: its admission slot, its outstanding-token lease
on the replica and its pending Idempotency-Key all expire in Redis unless refreshed.

`KeepAlive` refreshes whatever the request holds every `interval_s` while the request runs
(the holdings change: a retry takes a new lease). A refresh that fails (Redis down, hung) is
logged and tried again on the next tick; if Redis stays away longer than a lease's TTL, the
lease expires and Redis reclaims it, which is what must happen when the holder is gone anyway.
Invariant: `interval_s` is well below every TTL refreshed (a third or less), so one failed
tick never loses a live lease; nothing is refreshed past `max_s` (a request that was never
closed cannot keep its leases for ever). `stop()` returns promptly whatever the refresh in
progress does: it does not rely on cancellation alone, because Python 3.11's
`asyncio.wait_for` drops a cancellation that arrives as its inner call completes (the chaos
benchmark caught a request's cleanup waiting on a KeepAlive that went on for `max_s`, its usage
lease held all along, so the reaper never billed it).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

logger = logging.getLogger(__name__)

Refresh = Callable[[], Awaitable[object]]


class KeepAlive:
    """No task of its own until a refresh is due: a timer (`call_later`) per interval starts
    one refresh task, which re-arms the timer when it ends. Most requests end before the first
    interval, so they cost one timer, not a task, a `wait_for` and its inner task."""

    def __init__(self, interval_s: float, timeout_s: float, max_s: float):
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._max_s = max_s
        self._holdings: dict[str, Refresh] = {}
        self._task: asyncio.Task | None = None  # the refresh in progress
        self._timer: asyncio.TimerHandle | None = None
        self._end = 0.0
        self._stopped = False

    def hold(self, name: str, refresh: Refresh) -> None:
        if self._stopped:
            return
        self._holdings[name] = refresh
        if self._timer is None and self._task is None:
            loop = asyncio.get_running_loop()
            self._end = loop.time() + self._max_s
            self._timer = loop.call_later(self._interval_s, self._due)

    def drop(self, name: str) -> None:
        self._holdings.pop(name, None)

    def _due(self) -> None:
        self._timer = None
        if self._stopped:
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= self._end:
            return  # nothing is refreshed past max_s
        if not self._holdings:
            self._timer = loop.call_later(self._interval_s, self._due)
            return
        self._task = loop.create_task(self._refresh())

    async def _refresh(self) -> None:
        try:
            for name, refresh in list(self._holdings.items()):
                if self._stopped:
                    return
                try:
                    async with asyncio.timeout(self._timeout_s):
                        await refresh()
                except Exception as exc:  # noqa: BLE001 - next tick retries; TTL is the bound
                    logger.warning("could not refresh %s: %r", name, exc)
        finally:
            self._task = None  # (stop() may have cleared it already)
            if not self._stopped:
                self._timer = asyncio.get_running_loop().call_later(self._interval_s, self._due)

    async def stop(self) -> None:
        self._holdings.clear()
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # Bounded: a cancellation lost inside a refresh still ends the loop at the next
            # check of `_stopped`, at most one refresh timeout later.
            await asyncio.wait({task}, timeout=self._timeout_s + 1.0)
