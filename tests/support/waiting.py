"""Bounded waits for tests that have no event to wait on: poll a named condition until it
holds or a deadline passes. The deadline is a guard against hangs, not a timing threshold
(set it generously: the machine may be loaded); a miss fails with what was awaited."""
import asyncio
import inspect
import time

POLL_S = 0.01


def wait_until(predicate, timeout_s: float, what: str, period_s: float = POLL_S):
    """Return `predicate()`'s first truthy value; AssertionError naming `what` after
    `timeout_s`."""
    end = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= end:
            raise AssertionError(f"no {what} after {timeout_s} s")
        time.sleep(period_s)


async def async_wait_until(predicate, timeout_s: float, what: str,
                           period_s: float = POLL_S):
    """`wait_until` for the event loop: `predicate()` may return a value or an awaitable."""
    end = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() >= end:
            raise AssertionError(f"no {what} after {timeout_s} s")
        await asyncio.sleep(period_s)
