"""PerLoop: one object per running asyncio event loop, made on first use by a factory.

An async Redis client (and what holds one) belongs to the loop it was made on, so a process
that runs several loops (tests, the ASGI server's threads) needs one per loop. Held in a
WeakKeyDictionary: a closed, collected loop drops its object. Kept on an AppConfig, never in a
module global; tests may replace `factory`.
"""
from __future__ import annotations

import asyncio
import weakref
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    def __init__(self, factory: Callable[[], T]):
        self.factory = factory
        self._by_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # The last answer, for the common case of one loop per process: a WeakKeyDictionary
        # lookup makes a weak reference per call. A weak reference to the loop, so a closed
        # loop is still collected.
        self._last_loop = _dead_ref
        self._last: T | None = None

    def current(self) -> T:
        """This loop's object (must be called from a coroutine or callback on a running loop)."""
        loop = asyncio.get_running_loop()
        if self._last_loop() is loop:
            return self._last
        held = self._by_loop.get(loop)
        if held is None:
            held = self.factory()
            self._by_loop[loop] = held
        self._last_loop, self._last = weakref.ref(loop), held
        return held

    def get(self, loop) -> T | None:
        return self._by_loop.get(loop)

    def set(self, loop, value: T) -> None:
        self._forget_last()
        self._by_loop[loop] = value

    def pop(self, loop, default: T | None = None) -> T | None:
        """Forget `loop`'s object and return it (the caller closes it)."""
        self._forget_last()
        return self._by_loop.pop(loop, default)

    def _forget_last(self) -> None:
        self._last_loop, self._last = _dead_ref, None


def _dead_ref():
    return None
