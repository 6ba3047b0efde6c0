"""UsageLedger: what this replica computed for each request, by request id, for billing.

The platform bills a request from the replica's final response. When it never saw that response
(its client went away, the stream broke, the platform process died) it asks the ledger instead,
through a control request (`control_request.py`): the ledger is the replica's own account of
the tokens it prefilled and generated, the same numbers its counters
(`replica_prompt_tokens_total`, `replica_generated_tokens_total`) sum.

Invariants:
- a request id is `running` from `open` until `close`, then `finished` with its counts until it
  falls out (more than `capacity` finished entries, or older than `max_age_s`); otherwise it is
  `unknown`;
- `close` records the counts before the final response is sent, so whoever saw the final
  response finds the entry;
- thread-safe: the engine loop closes, control requests read and wait.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Callable, Iterable

RUNNING, FINISHED, UNKNOWN = "running", "finished", "unknown"


@dataclass(frozen=True)
class ComputedUsage:
    state: str
    input_tokens: int = 0  # prompt tokens prefilled (prefix-cache hits included)
    cached_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = ""
    error: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


_RUNNING = ComputedUsage(RUNNING)
_UNKNOWN = ComputedUsage(UNKNOWN)


class UsageLedger:
    def __init__(self, capacity: int = 200_000, max_age_s: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._capacity = capacity
        self._max_age_s = max_age_s
        self._clock = clock
        self._cond = threading.Condition()
        self._running: set[str] = set()
        self._finished: OrderedDict[str, tuple[float, ComputedUsage]] = OrderedDict()

    def open(self, request_id: str) -> None:
        with self._cond:
            self._running.add(request_id)

    def close(self, request_id: str, usage: ComputedUsage) -> None:
        with self._cond:
            self._running.discard(request_id)
            self._finished.pop(request_id, None)
            self._finished[request_id] = (self._clock(), usage)
            self._evict()
            self._cond.notify_all()

    def forget(self, request_id: str) -> None:
        """The request never reached the engine (refused at submit): nothing was computed."""
        with self._cond:
            self._running.discard(request_id)
            self._cond.notify_all()

    def lookup(self, request_ids: Iterable[str]) -> dict[str, ComputedUsage]:
        with self._cond:
            return {rid: self._get(rid) for rid in request_ids}

    def wait(self, request_ids: Iterable[str], timeout_s: float) -> dict[str, ComputedUsage]:
        """Wait up to `timeout_s` for none of `request_ids` to be running, then look them up."""
        ids = list(request_ids)
        with self._cond:
            self._cond.wait_for(lambda: not any(rid in self._running for rid in ids),
                                timeout=max(0.0, timeout_s))
            return {rid: self._get(rid) for rid in ids}

    def _get(self, request_id: str) -> ComputedUsage:
        if request_id in self._running:
            return _RUNNING
        entry = self._finished.get(request_id)
        return _UNKNOWN if entry is None else entry[1]

    def _evict(self) -> None:
        oldest = self._clock() - self._max_age_s
        while self._finished:
            request_id, (closed_at, _) = next(iter(self._finished.items()))
            if len(self._finished) <= self._capacity and closed_at >= oldest:
                break
            del self._finished[request_id]
