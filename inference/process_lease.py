"""ProcessLease: one API process (one request-path container) says in Redis that it is alive.

The key `{prefix}proc:{process_id}` exists while the process runs: set when the first request
needs it (`ensure`), refreshed every `interval_s` by a background task, deleted on a clean
shutdown (`stop`), and expired `ttl_s` after the last refresh when the process was killed.
Things a process holds on behalf of its requests (a pending Idempotency-Key entry) name its
process id, so another process can tell a dead holder from a slow one at once instead of
waiting out the holding's own, much longer TTL (inference/idempotency.py).

Invariants:
- `ensure()` returns only once the key was written at least once: nothing names a process
  id whose key was never set;
- `interval_s` is at most a third of `ttl_s`, so one failed refresh never lets a live lease
  lapse; a refresh that fails (Redis down, hung) is logged and tried again on the next tick;
- Redis paused for longer than `ttl_s` makes a live process look dead (the clock in Redis moves
  on); `ttl_s` is therefore kept well above the pauses the platform is meant to ride out (the
  default 10 s against the chaos benchmark's 5 s pause).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

import redis

from common import redis_keys

logger = logging.getLogger(__name__)


def process_key(prefix: str, process_id: str) -> str:
    return redis_keys.api_process(prefix, process_id)


class ProcessLease:
    def __init__(self, client, prefix: str, ttl_s: float, interval_s: float,
                 process_id: str | None = None):
        if interval_s * 3 > ttl_s:
            raise ValueError("a process lease is refreshed at least three times per TTL")
        self._redis = client
        self.process_id = process_id or uuid.uuid4().hex
        self.key = process_key(prefix, self.process_id)
        self.key_prefix = process_key(prefix, "")
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self._interval_s = interval_s
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    async def ensure(self) -> str:
        """The process id, once its key is set and kept alive (raises on Redis trouble)."""
        if self._task is None:
            async with self._lock:
                if self._task is None:
                    await self._set()
                    self._task = asyncio.get_running_loop().create_task(self._keep())
        return self.process_id

    async def stop(self) -> None:
        """A clean shutdown: stop refreshing and delete the key (its holdings are free now)."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        try:
            await self._redis.delete(self.key)
        except (redis.RedisError, OSError) as exc:
            logger.warning("process lease %s not deleted (%r); it expires", self.key, exc)

    async def _set(self) -> None:
        await self._redis.set(self.key, b"1", px=self._ttl_ms)

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can drop the
                # cancellation `stop()` sends (inference/keepalive.py).
                async with asyncio.timeout(self._interval_s):
                    await self._set()
            except Exception as exc:  # noqa: BLE001 - next tick retries; the TTL is the bound
                logger.warning("process lease %s not refreshed: %r", self.key, exc)
