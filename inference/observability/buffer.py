"""MetricBuffer: increments gathered in the process, written to Redis in the background.

Recording a request's metrics must not delay its reply (a pipelined write of a generation's ~16
fields cost ~0.5 ms here): `add` merges a Batch into the buffer (pure Python, no I/O) and, if no
flush is pending, schedules one METRICS_FLUSH_SECONDS later; `flush` writes everything gathered
now (the /metrics view calls it first, so this process's own samples are never behind its
scrape). Other processes' samples reach Redis within their flush interval. Invariants: one buffer
per event loop (its Redis client belongs to that loop); a failed write drops that batch (logged),
never raises into a request; increments still buffered when the process exits are lost.
"""
from __future__ import annotations

import asyncio
import contextvars
import logging

from django.apps import apps

from inference.observability.store import Batch, MetricStore

logger = logging.getLogger(__name__)


class MetricBuffer:
    def __init__(self, store: MetricStore, interval_s: float):
        self._store = store
        self._interval_s = interval_s
        self._pending = Batch()
        self._task: asyncio.Task | None = None

    def add(self, batch: Batch) -> None:
        for key, value in batch.increments.items():
            self._pending.increments[key] = self._pending.increments.get(key, 0) + value
        if self._task is None or self._task.done():
            # An empty context: the flush serves no request (its log lines name none).
            self._task = asyncio.get_running_loop().create_task(
                self._flush_later(), context=contextvars.Context())

    @property
    def scheduled_flush(self) -> asyncio.Task | None:
        """The background flush pending or last run (tests await it)."""
        return self._task

    async def _flush_later(self) -> None:
        await asyncio.sleep(self._interval_s)
        await self.flush()

    async def flush(self) -> None:
        batch, self._pending = self._pending, Batch()
        try:
            await self._store.write(batch)
        except Exception:  # noqa: BLE001 - metrics are best effort
            logger.warning("platform metrics not written (%d fields dropped)",
                           len(batch.increments), exc_info=True)


def current_buffer() -> MetricBuffer:
    """This event loop's buffer (kept beside the loop's container on the inference app, which
    makes one per loop writing through that loop's Redis client: inference/apps.py)."""
    return apps.get_app_config("inference").metric_buffers.current()
