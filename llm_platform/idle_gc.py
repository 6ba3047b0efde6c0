"""The API process's cyclic garbage collection: between bursts, not inside them.

CPython collects its youngest generation every 700 net allocations of container objects, so a
burst of requests (each allocating a few thousand) triggers collections while it is being
prepared, and each one scans every young object alive at that moment: the state of every
request in flight. Measured with `gc.callbacks` on an API process serving 43 rounds of 32
streams (benchmarks/README.md, round frontdoor14): 452-528 collections inside requests, 112-145
ms of the process's CPU (80-105 us per request, about a tenth of a short request's cost),
three of them full collections of about 8 ms each.

`IdleCollector` raises the young generation's threshold (`API_GC_YOUNG_THRESHOLD`, 20000:
automatic collections become rare; the older generations keep Python's thresholds, counted in
young collections as before) and runs the collection itself when the process has no
generation request in flight: the last request of a burst ends, and on the next turn of the
event loop, if nothing started meanwhile and at least `min_young` objects are pending, it
collects the generation Python would have chosen by its counts. Then the only young objects
are what outlived the burst (caches, connections) and its garbage, so the scan is short, and
no request waits for it. Under load that never pauses, the raised threshold is what collects,
less often.

`install()` is called once per API process (llm_platform/asgi.py, after `gc.freeze()`);
`inference/views/direct.py` brackets each generation request with `begin()` / `end()`.
WebSocket generations are not counted: a collection may run while one streams (as any
collection did before), never inside an HTTP burst's requests.
`API_GC_YOUNG_THRESHOLD=0` leaves Python's collector as it is.
"""
from __future__ import annotations

import asyncio
import gc as _gc

_current: "IdleCollector | None" = None


class IdleCollector:
    def __init__(self, young_threshold: int, min_young: int = 200, gc=_gc):
        self._gc = gc
        self._young_threshold = young_threshold
        self._min_young = min_young
        self._in_flight = 0
        self._scheduled = False
        self.collections = [0, 0, 0]  # idle collections run, by generation

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def install(self) -> None:
        _, middle, old = self._gc.get_threshold()
        self._gc.set_threshold(self._young_threshold, middle, old)

    def begin(self) -> None:
        self._in_flight += 1

    def end(self) -> None:
        self._in_flight -= 1
        if not self._in_flight and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.collect_if_idle)

    def collect_if_idle(self) -> int | None:
        """Collects (returns the generation) when no request is in flight and enough young
        objects are pending; else None."""
        self._scheduled = False
        gc = self._gc
        if self._in_flight or not gc.isenabled():
            return None
        young, middle, old = gc.get_count()
        if young < self._min_young:
            return None
        _, middle_threshold, old_threshold = gc.get_threshold()
        generation = 0
        if middle >= middle_threshold:  # as Python picks: the oldest whose count is over
            generation = 2 if old >= old_threshold else 1
        gc.collect(generation)
        self.collections[generation] += 1
        return generation


def install(young_threshold: int) -> IdleCollector | None:
    """This process's collector (None, and Python's thresholds unchanged, for 0)."""
    global _current
    if young_threshold <= 0:
        _current = None
        return None
    _current = IdleCollector(young_threshold)
    _current.install()
    return _current


def current() -> IdleCollector | None:
    return _current
