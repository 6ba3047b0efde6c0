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

    def current(self) -> T:
        """This loop's object (must be called from a coroutine or callback on a running loop)."""
        loop = asyncio.get_running_loop()
        held = self._by_loop.get(loop)
        if held is None:
            held = self.factory()
            self._by_loop[loop] = held
        return held

    def get(self, loop) -> T | None:
        return self._by_loop.get(loop)

    def set(self, loop, value: T) -> None:
        self._by_loop[loop] = value

    def pop(self, loop, default: T | None = None) -> T | None:
        """Forget `loop`'s object and return it (the caller closes it)."""
        return self._by_loop.pop(loop, default)
