"""What each replica reports on its metrics port, polled about every second and shared in Redis.

Where the poller runs: an asyncio task inside every platform process (started with the
process's request-path container), not a Celery beat task. Reasons: the signals are needed
wherever the router runs, including deployments and tests that run only daphne; beat is built
for schedules of seconds to hours and would add a broker round trip and a worker hop per tick;
and the work is a few tiny HTTP GETs. So that N processes do not poll each replica N times a
second, each tick claims a short Redis lease per replica (`SET NX PX`): one process polls it,
every process reads the result.

Stale signals expire: each replica's snapshot is a Redis hash with a TTL of a few intervals,
so a replica that stops answering has no signals (the policies then treat them as unknown)
rather than old ones.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import httpx

from replica import metric_names
from common import redis_keys

logger = logging.getLogger(__name__)

# The replica's metric names are defined once (replica/metric_names.py). Metric name on the
# replica's port -> the field of ReplicaSignals that holds it.
_FIELD_OF_METRIC = {
    metric_names.RUNNING_SEQS: "running_seqs",
    metric_names.WAITING_SEQS: "waiting_seqs",
    metric_names.KV_FREE_BLOCKS: "kv_free_blocks",
    metric_names.KV_FREE_UNCACHED_BLOCKS: "kv_free_uncached_blocks",
    metric_names.KV_TOTAL_BLOCKS: "kv_total_blocks",
    metric_names.PREFIX_CACHE_HIT_TOKENS: "prefix_hit_tokens",
    metric_names.PROMPT_TOKENS: "prompt_tokens",
    metric_names.GENERATED_TOKENS: "generated_tokens",
    metric_names.PREEMPTIONS: "preemptions",
}
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)", re.M)


@dataclass(frozen=True)
class ReplicaSignals:
    running_seqs: int | None = None
    waiting_seqs: int | None = None
    kv_free_blocks: int | None = None  # cached prefixes included
    kv_free_uncached_blocks: int | None = None  # free without evicting a cached prefix
    kv_total_blocks: int | None = None
    prefix_hit_tokens: int | None = None
    prompt_tokens: int | None = None
    generated_tokens: int | None = None
    preemptions: int | None = None


def parse_metrics(text: str) -> ReplicaSignals:
    """The replica's gauges and counters from Prometheus text (summed over label sets). A
    report of 0 total KV blocks has no KV figures (unknown: the policies add nothing for them)."""
    values: dict[str, float] = {}
    for name, value in _LINE.findall(text):
        field = _FIELD_OF_METRIC.get(name)
        if field is not None:
            try:
                values[field] = values.get(field, 0.0) + float(value)
            except ValueError:
                continue
    if values.get("kv_total_blocks") == 0:
        # No pool reported yet (gauges left at their 0 before an engine published them): its
        # free blocks are unknown, not none; read as none, routing shuns an idle replica.
        for field in ("kv_free_blocks", "kv_free_uncached_blocks", "kv_total_blocks"):
            values.pop(field, None)
    return ReplicaSignals(**{k: int(v) for k, v in values.items()})


_INFO = re.compile(rf"^{metric_names.ENGINE_INFO}\{{([^}}]*)\}}", re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_info(text: str) -> dict[str, str]:
    """What the replica's engine runs, from its `replica_engine_info` labels (model, version,
    dtype, quantization); empty when the replica does not report it."""
    found = _INFO.search(text)
    return dict(_LABEL.findall(found.group(1))) if found else {}


_PARSED_KEPT = 4096  # replicas whose last row is kept parsed (then forgotten all at once)


def _from_row(row: dict) -> ReplicaSignals:
    """A stored hash (bytes names and values) as signals; fields it does not know are
    dropped."""
    fields = ReplicaSignals.__dataclass_fields__
    return ReplicaSignals(**{name: int(v) for k, v in row.items()
                             if (name := k.decode()) in fields})


class SignalStore:
    def __init__(self, redis, key_prefix: str, ttl_s: float):
        self._redis = redis
        self._prefix = key_prefix
        self._ttl_ms = max(1, int(ttl_s * 1000))
        # replica id -> (its last row read, that row parsed): a row changes about once a poll
        # interval (a second), and every request's routing snapshot reads it; parsing one
        # (about 3 us) is then a dict comparison (0.1 us). ReplicaSignals is frozen: shared.
        self._parsed: dict[int, tuple[dict, ReplicaSignals]] = {}

    def key(self, replica_id: int) -> str:
        return redis_keys.replica_load(self._prefix, replica_id)

    def lease_key(self, replica_id: int) -> str:
        return redis_keys.replica_load_poll(self._prefix, replica_id)

    async def write(self, replica_id: int, signals: ReplicaSignals) -> None:
        mapping = {k: v for k, v in signals.__dict__.items() if v is not None}
        if not mapping:
            return
        pipe = self._redis.pipeline(transaction=True)
        pipe.delete(self.key(replica_id))
        pipe.hset(self.key(replica_id), mapping=mapping)
        pipe.pexpire(self.key(replica_id), self._ttl_ms)
        await pipe.execute()

    async def read(self, replica_ids: Sequence[int]) -> dict[int, ReplicaSignals]:
        """Only replicas with fresh signals appear."""
        pipe = self._redis.pipeline(transaction=False)
        parse = self.queue_read(pipe, replica_ids)
        return parse(iter(await pipe.execute()))

    def queue_read(self, pipe, replica_ids: Sequence[int]):
        """`read` queued on `pipe`; returns the parser (it consumes its results in order)."""
        for rid in replica_ids:
            pipe.execute_command("HGETALL", self.key(rid))

        def parse(rows: Iterator) -> dict[int, ReplicaSignals]:
            out = {}
            parsed = self._parsed
            for rid in replica_ids:
                row = next(rows)
                if row:
                    last = parsed.get(rid)
                    if last is not None and last[0] == row:
                        out[rid] = last[1]
                        continue
                    signals = out[rid] = _from_row(row)
                    if len(parsed) >= _PARSED_KEPT:
                        parsed.clear()
                    parsed[rid] = (row, signals)
            return out
        return parse

    async def claim_poll(self, replica_id: int, interval_s: float) -> bool:
        # Slightly shorter than the interval, so the next tick of any process may claim again.
        lease_ms = max(1, int(interval_s * 900))
        return bool(await self._redis.set(self.lease_key(replica_id), "1", nx=True, px=lease_ms))


class SignalPoller:
    """Polls the metrics port of every replica this process routes to (the router tells it
    which: `watch`). Runs as one asyncio task per event loop until `stop`."""

    # A replica the router has not offered for this long (stopped, failed) is no longer polled.
    forget_after_s = 60.0

    def __init__(self, store: SignalStore, interval_s: float, timeout_s: float,
                 sleep: Callable[[float], object] = asyncio.sleep,
                 clock: Callable[[], float] = time.monotonic):
        self._store = store
        self._interval = interval_s
        self._timeout = timeout_s
        self._sleep = sleep
        self._clock = clock
        self._watched: dict[int, str] = {}  # replica id -> metrics host:port
        self._last_seen: dict[int, float] = {}
        self._task: asyncio.Task | None = None
        self._http: httpx.AsyncClient | None = None

    def watch(self, replicas: Sequence) -> None:
        """Poll these replicas (ReplicaInfo) from now on; starts the task on first use."""
        now = self._clock()
        for replica in replicas:
            if replica.metrics_address:
                self._watched[replica.replica_id] = replica.metrics_address
                self._last_seen[replica.replica_id] = now
        if self._task is None and self._watched and self._interval > 0:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def poll_once(self) -> dict[int, ReplicaSignals]:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self._timeout)
        oldest = self._clock() - self.forget_after_s
        for rid in [rid for rid, seen in self._last_seen.items() if seen < oldest]:
            self._watched.pop(rid, None)
            self._last_seen.pop(rid, None)
        watched = list(self._watched.items())
        claimed = [(rid, addr) for rid, addr in watched
                   if await self._store.claim_poll(rid, self._interval)]
        results = await asyncio.gather(*(self._fetch(addr) for _, addr in claimed))
        polled = {}
        for (rid, _), signals in zip(claimed, results):
            if signals is not None:
                await self._store.write(rid, signals)
                polled[rid] = signals
        return polled

    async def _fetch(self, address: str) -> ReplicaSignals | None:
        try:
            response = await self._http.get(f"http://{address}/metrics")
            response.raise_for_status()
        except httpx.HTTPError:
            return None  # its old signals expire; health and the circuit handle the rest
        return parse_metrics(response.text)

    async def _run(self) -> None:
        while True:
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - Redis down for a moment: try next tick
                logger.warning("replica signal poll failed", exc_info=True)
            await self._sleep(self._interval)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
            self._task = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None
