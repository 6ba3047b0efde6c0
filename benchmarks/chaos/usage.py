"""The billing side: waiting for the consumer to drain, then the usage rows' tokens.

Drained means: the usage stream is empty (the consumer deletes what it acknowledged), the
host's outbox holds no event, no usage row is still pending (the final event of a request whose
API process was killed never comes: Celery beat's reaper finalises its row from the replica's
usage ledger), and the count of usage rows has not moved for `stable_s`.
"""
from __future__ import annotations

import time
from pathlib import Path

import psycopg
import redis


def outbox_events(directory: Path) -> int:
    count = 0
    for path in list(directory.glob("*.jsonl")) + list(directory.glob("*.replay")):
        try:
            count += sum(1 for line in path.read_text().splitlines() if line.strip())
        except OSError:
            pass
    return count


def usage_row_counts(database_url: str) -> tuple[int, int]:
    """(usage rows, of which pending)."""
    with psycopg.connect(database_url.replace("postgres://", "postgresql://", 1),
                         connect_timeout=5) as conn:
        return conn.execute("SELECT count(*), count(*) FILTER (WHERE status = 'pending') "
                            "FROM billing_usagerecord").fetchone()


def wait_drained(redis_url: str, stream_key: str, outbox_dir: Path, database_url: str,
                 deadline_s: float, stable_s: float = 3.0) -> dict:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    start = time.monotonic()
    last_count, stable_since = -1, time.monotonic()
    state = {}
    while time.monotonic() - start < deadline_s:
        try:
            rows, pending = usage_row_counts(database_url)
            state = {"stream_len": client.xlen(stream_key),
                     "outbox_events": outbox_events(outbox_dir),
                     "usage_rows": rows, "pending_rows": pending}
        except (redis.RedisError, psycopg.Error, OSError) as exc:
            state = {"error": repr(exc)}
            time.sleep(1.0)
            continue
        if state["usage_rows"] != last_count:
            last_count, stable_since = state["usage_rows"], time.monotonic()
        if (state["stream_len"] == 0 and state["outbox_events"] == 0
                and state["pending_rows"] == 0 and time.monotonic() - stable_since >= stable_s):
            return {"drained": True, "seconds": round(time.monotonic() - start, 2), **state}
        time.sleep(0.5)
    return {"drained": False, "seconds": round(time.monotonic() - start, 2), **state}


def billed(database_url: str) -> dict:
    """Tokens on the usage rows (input includes cached; both counted as billed)."""
    with psycopg.connect(database_url.replace("postgres://", "postgresql://", 1),
                         connect_timeout=5) as conn:
        rows, inputs, cached, outputs = conn.execute(
            "SELECT count(*), coalesce(sum(input_tokens), 0), coalesce(sum(cached_tokens), 0),"
            " coalesce(sum(output_tokens), 0) FROM billing_usagerecord").fetchone()
        by_status = dict(conn.execute(
            "SELECT status, count(*) FROM billing_usagerecord GROUP BY status").fetchall())
    return {"usage_rows": rows, "input_tokens": int(inputs), "cached_tokens": int(cached),
            "output_tokens": int(outputs), "rows_by_status": by_status}


def dead_letters(redis_url: str, stream_key: str) -> int:
    return redis.Redis.from_url(redis_url, socket_timeout=5).xlen(stream_key + ":dead")
