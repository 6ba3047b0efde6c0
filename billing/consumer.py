"""The billing consumer: usage stream (Redis consumer group) -> PostgreSQL, exactly once.

Each step: replay this host's outbox into the stream, claim entries a dead consumer left
pending (XAUTOCLAIM, idle > `claim_idle_ms`), else read new ones (XREADGROUP), write them in
one transaction (`write_usage`, idempotent on the request id), then XACK + XDEL them.

Exactly once follows from: an entry is acknowledged only after its row is committed; an entry
read but not acknowledged (crash, PostgreSQL down) stays pending and is read again, by this
consumer after a restart (it reads its own pending list first) or by another one via
XAUTOCLAIM; the second write of a request id is a no-op. Acknowledged entries are deleted, so
the stream holds only work not yet in PostgreSQL.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import redis
from django.db import DatabaseError, DataError, IntegrityError

from billing.events import UsageEvent
from billing.outbox import FileOutbox
from billing.services import write_usage
from billing.stream import FIELD, GROUP, StreamKeys, send_batch

logger = logging.getLogger(__name__)

Entry = tuple[bytes, dict]


class UsageConsumer:
    def __init__(self, client: redis.Redis, keys: StreamKeys, name: str, *,
                 outbox: FileOutbox | None = None, batch_size: int = 500, block_ms: int = 1000,
                 claim_idle_ms: int = 30_000,
                 write: Callable[[list[UsageEvent]], None] = write_usage,
                 crash_hook: Callable[[str], None] | None = None):
        self.client = client
        self.keys = keys
        self.name = name
        self.outbox = outbox
        self.batch_size = batch_size
        self.block_ms = block_ms
        self.claim_idle_ms = claim_idle_ms
        self.write = write
        # Tests: called with "after_write" between the commit and the ack.
        self.crash_hook = crash_hook
        self._own_pending_first = True  # after a start or a failure: re-read our pending list
        self._claim_cursor = "0-0"

    def ensure_group(self) -> None:
        try:
            self.client.xgroup_create(self.keys.stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def replay_outbox(self) -> int:
        if self.outbox is None:
            return 0
        return self.outbox.replay(lambda events: send_batch(self.client, self.keys, events),
                                  self.batch_size)

    def step(self, block_ms: int | None = None) -> int:
        """One batch; returns how many entries were handled (0: nothing to do)."""
        entries = self._next_entries(self.block_ms if block_ms is None else block_ms)
        if not entries:
            return 0
        try:
            self._handle(entries)
        except BaseException:
            self._own_pending_first = True
            raise
        return len(entries)

    def _next_entries(self, block_ms: int) -> list[Entry]:
        if self._own_pending_first:
            reply = self.client.xreadgroup(GROUP, self.name, {self.keys.stream: "0"},
                                           count=self.batch_size)
            entries = reply[0][1] if reply else []
            if entries:
                return entries
            self._own_pending_first = False
        claimed = self.client.xautoclaim(self.keys.stream, GROUP, self.name,
                                         min_idle_time=self.claim_idle_ms,
                                         start_id=self._claim_cursor, count=self.batch_size)
        self._claim_cursor = claimed[0]
        if claimed[1]:
            logger.info("claimed %d pending usage entries of a dead consumer", len(claimed[1]))
            return claimed[1]
        reply = self.client.xreadgroup(GROUP, self.name, {self.keys.stream: ">"},
                                       count=self.batch_size, block=block_ms or None)
        return reply[0][1] if reply else []

    def _handle(self, entries: list[Entry]) -> None:
        events, dead = [], []
        for entry_id, fields in entries:
            try:
                events.append(UsageEvent.from_json(fields[FIELD.encode()]))
            except (KeyError, TypeError, ValueError):
                dead.append((entry_id, fields or {}))
        try:
            self.write(events)
        except (IntegrityError, DatabaseError) as exc:
            if not _is_data_error(exc):
                raise  # PostgreSQL unavailable: leave everything pending
            dead += self._write_one_by_one(events, entries)
        if self.crash_hook is not None:
            self.crash_hook("after_write")
        pipe = self.client.pipeline(transaction=True)
        for entry_id, fields in dead:
            pipe.xadd(self.keys.dead_letters, fields or {"unreadable": entry_id})
        ids = [entry_id for entry_id, _ in entries]
        pipe.xack(self.keys.stream, GROUP, *ids)
        pipe.xdel(self.keys.stream, *ids)
        pipe.execute()

    def _write_one_by_one(self, events: list[UsageEvent], entries: list[Entry]) -> list[Entry]:
        by_request = {}
        for entry_id, fields in entries:
            raw = (fields or {}).get(FIELD.encode())
            if raw is not None:
                by_request.setdefault(raw, (entry_id, fields))
        dead = []
        for event in events:
            try:
                self.write([event])
            except (IntegrityError, DataError):
                logger.error("usage %s refused by PostgreSQL; dead-lettered", event.request_id)
                dead.append(by_request.get(event.to_json().encode(),
                                           (b"?", {FIELD: event.to_json()})))
        return dead

    def finish(self, deadline_s: float = 20.0, clock: Callable[[], float] = time.monotonic) -> int:
        """On the way out: replay the outbox and consume until the stream is empty (or
        `deadline_s` passed, or Redis/PostgreSQL fail); returns the entries handled. What is
        left stays in the stream for the next start."""
        end = clock() + deadline_s
        total = 0
        try:
            total += self.replay_outbox()
            while clock() < end:
                handled = self.step(block_ms=0)
                if not handled:
                    break
                total += handled
        except (redis.RedisError, OSError, DatabaseError) as exc:
            logger.warning("billing consumer: final drain stopped: %s", exc)
        return total

    def run(self, should_stop: Callable[[], bool], idle_sleep_s: float = 1.0) -> None:
        """Until `should_stop()`: replay the outbox, consume; on Redis or PostgreSQL trouble,
        log, wait and retry (nothing is acknowledged that was not written)."""
        self.ensure_group()
        while not should_stop():
            try:
                self.replay_outbox()
                self.step()
            except (redis.RedisError, OSError, DatabaseError) as exc:
                self._own_pending_first = True
                logger.warning("billing consumer: %s; retrying", exc)
                time.sleep(idle_sleep_s)
                try:
                    self.ensure_group()  # a restarted Redis without persistence lost it
                except (redis.RedisError, OSError):
                    pass


def _is_data_error(exc: Exception) -> bool:
    """True for a row PostgreSQL refuses (FK, constraint, bad value): retrying cannot help."""
    return isinstance(exc, (IntegrityError, DataError))
