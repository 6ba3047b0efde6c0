"""Requests still waiting for their first token go first; streams that already have one wait
a little, then send what gathered meanwhile together.

On one event loop, everything a request does before its first token (authenticate, parse,
quota, admission, routing, sending it to the replica, the first token's bookkeeping) competes
for the CPU with the relay of streams already answered: reading each token off the replica's
call, framing it, writing it. Against the zero-cost fake replica a stream's 64 tokens cost the
API process about three times one request's preparation, so when 32 requests arrive together,
the relays of the first ones answered take most of the CPU the later ones need to be prepared,
and time to first token grows with the burst (round frontdoor10, benchmarks/README.md).

`FirstTokenPriority.pending()` marks a request from its arrival until its first token is on
its way (a stream: the first token received; a whole reply: the reply). While any request is
pending, a stream's pump waits before it reads on (`quiet()`): until no request is pending, or
`defer_s` at the most (one timer for all the streams that wait). Its tokens gather on the
replica's call meanwhile and leave as one frame set, which costs less than one each; the
stream's inter-token time grows by at most `defer_s` while bursts arrive.

A request that arrives in order, prepares in order: preparing them one or a few at a time
(a FIFO of turns) was measured and is worse here, since each preparation's Redis round trips
then wait for a core the replica and the clients are using.

One per event loop (the container's); `defer_s` 0 turns it off. Setting: API_RELAY_DEFER_MS.
"""
from __future__ import annotations

import asyncio


class FirstTokenPriority:
    def __init__(self, defer_s: float):
        self._defer_s = defer_s
        self._pending = 0
        self._quiet: asyncio.Event | None = None  # set when none is pending, or defer_s passed
        self._flush_timer: asyncio.TimerHandle | None = None

    @property
    def pending_count(self) -> int:
        return self._pending

    def pending(self) -> "_Pending":
        """A request before its first token (the `with` block's extent)."""
        return _Pending(self)

    def _enter(self) -> None:
        self._pending += 1

    def _exit(self) -> None:
        self._pending -= 1
        if not self._pending:
            self._release()

    async def quiet(self) -> None:
        """Returns at once when no request is pending (or the priority is off); else when none
        is any more, or after defer_s."""
        if not self._pending or self._defer_s <= 0:
            return
        if self._quiet is None:
            self._quiet = asyncio.Event()
            self._flush_timer = asyncio.get_running_loop().call_later(self._defer_s,
                                                                      self._release)
        await self._quiet.wait()

    def _release(self) -> None:
        quiet, self._quiet = self._quiet, None
        if quiet is not None:
            quiet.set()
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None


class _Pending:
    """`FirstTokenPriority.pending()`: a class, not a generator context manager (one per
    request, on its way to the first token)."""

    __slots__ = ("_priority",)

    def __init__(self, priority: FirstTokenPriority):
        self._priority = priority

    def __enter__(self) -> None:
        self._priority._enter()

    def __exit__(self, *exc) -> None:
        self._priority._exit()
