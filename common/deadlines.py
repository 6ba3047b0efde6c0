"""Deadlines: `asyncio.timeout_at` bounds on one event loop, one timer for all of them.

Every generation request is bounded two or three times (its preparation, its first token or
whole reply, its end's Redis round trip), and each `asyncio.timeout_at` costs a Timeout, the
current task's lookup, a timer handle armed in the loop's heap and cancelled again: about 3 % of
the API process's CPU per short request (py-spy, benchmarks/README.md "frontdoor16"), for
deadlines that are seconds away and almost never reached.

`Deadlines.at(when)` is the same bound as `asyncio.timeout_at(when)` (an async context manager:
the block's task is cancelled at `when`, and that cancellation leaves the block as
`TimeoutError`; a cancellation from elsewhere, alone or at the same time, stays a
cancellation), but entering one only adds it to a set, and one timer for the loop, armed while
any bound is open, ends the bounds that are due every `resolution_s`: a bound ends up to
`resolution_s` after its deadline (50 ms by default, against deadlines of seconds). A deadline
already past when the block is entered ends it on the loop's next turn, as asyncio's does.

One per event loop (its timer belongs to the loop that first opened a bound).
"""
from __future__ import annotations

import asyncio

RESOLUTION_S = 0.05


class Deadlines:
    __slots__ = ("_resolution", "_open", "_handle", "_loop")

    def __init__(self, resolution_s: float = RESOLUTION_S):
        self._resolution = resolution_s
        self._open: set[Bound] = set()
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def at(self, when: float) -> "Bound":
        """A bound ending at `when` (the event loop's clock), as `asyncio.timeout_at(when)`."""
        return Bound(self, when)

    @property
    def open_count(self) -> int:
        return len(self._open)

    def _add(self, bound: "Bound", loop: asyncio.AbstractEventLoop) -> None:
        self._open.add(bound)
        if self._handle is None:
            self._loop = loop
            self._handle = loop.call_at(loop.time() + self._resolution, self._tick)

    def _tick(self) -> None:
        loop = self._loop
        now = loop.time()
        due = [bound for bound in self._open if bound.when <= now]
        for bound in due:
            self._open.discard(bound)
            bound._expire()
        self._handle = (loop.call_at(now + self._resolution, self._tick) if self._open
                        else None)

    def close(self) -> None:
        """The timer stopped (the bounds still open never end by it)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._open.clear()


class Bound:
    __slots__ = ("_deadlines", "when", "_task", "_cancelling", "_expired", "_active")

    def __init__(self, deadlines: Deadlines, when: float):
        self._deadlines = deadlines
        self.when = when
        self._task: asyncio.Task | None = None
        self._cancelling = 0
        self._expired = False
        self._active = False

    def expired(self) -> bool:
        """Whether this bound ended its block (as asyncio.Timeout.expired)."""
        return self._expired

    async def __aenter__(self) -> "Bound":
        if self._task is not None:
            raise RuntimeError("a deadline bound is entered once")
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline bound must be used inside a task")
        self._task, self._cancelling, self._active = task, task.cancelling(), True
        loop = task.get_loop()
        if self.when <= loop.time():
            loop.call_soon(self._expire)
        else:
            self._deadlines._add(self, loop)
        return self

    async def __aexit__(self, exc_type, exc_value, traceback) -> None:
        self._active = False
        self._deadlines._open.discard(self)
        if self._expired and self._task.uncancel() <= self._cancelling \
                and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc_value
        return None

    def _expire(self) -> None:
        if self._active and not self._expired:
            self._expired = True
            self._task.cancel()
