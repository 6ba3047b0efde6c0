"""Billing writes. `record_usage` is the request path's call (it appends to the usage stream);
`write_usage` is the consumer's and the reaper's (PostgreSQL, idempotent on the request id)."""
from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

from django.apps import apps
from django.db import connection, transaction

from billing.events import UsageEvent
from billing.leases import UsageLease
from billing.models import Price, UsageRecord

__all__ = ["UsageEvent", "record_usage", "write_usage", "set_price"]


def current_recorder():
    """The per-event-loop UsageRecorder (an async Redis client belongs to its loop), kept on the
    billing AppConfig rather than in a module global; tests may replace `recorders.factory`."""
    return apps.get_app_config("billing").recorders.current()


async def record_usage(event: UsageEvent, lease: UsageLease | None = None) -> None:
    """Record one finished request: onto the usage stream, or the local outbox when Redis is
    unreachable. Returns once the event is durable in one of them. `lease`: the request's
    usage lease, set in the same round trip just before the (pending) event."""
    await current_recorder().record(event, lease)


def queue_pending_usage(pipe, event: UsageEvent, lease: UsageLease):
    """A request's pending event and usage lease queued on another call's pipeline (one round
    trip); returns the `finish(results)` to await (billing/stream.py `queue_pending`)."""
    return current_recorder().queue_pending(pipe, event, lease)


_COLUMNS = [  # (column, PostgreSQL array type, value)
    ("request_id", "varchar", lambda e: e.request_id),
    ("tenant_id", "bigint", lambda e: e.tenant_id),
    ("api_key_id", "bigint", lambda e: e.api_key_id),
    ("model_name", "varchar", lambda e: e.model_name),
    ("model_version_id", "bigint", lambda e: e.model_version_id),
    ("replica_id", "bigint", lambda e: e.replica_id),
    ("input_tokens", "integer", lambda e: e.input_tokens),
    ("cached_tokens", "integer", lambda e: e.cached_tokens),
    ("output_tokens", "integer", lambda e: e.output_tokens),
    ("estimated_tokens", "integer", lambda e: e.estimated_tokens),
    ("ttft_ms", "float8", lambda e: e.ttft_ms),
    ("total_ms", "float8", lambda e: e.total_ms),
    ("status", "varchar", lambda e: e.status),
    ("finish_reason", "varchar", lambda e: e.finish_reason),
    ("endpoint", "varchar", lambda e: e.endpoint),
    ("occurred_at", "timestamptz",
     lambda e: datetime.fromtimestamp(e.occurred_at or 0.0, tz=timezone.utc)),
]
_TABLE = UsageRecord._meta.db_table
# One statement per batch, whatever its size: the columns travel as arrays (unnest), so the
# consumer pays one round trip and no per-row SQL compilation.
_SELECT = (
    f"INSERT INTO {_TABLE} "
    f"({', '.join(name for name, _, _ in _COLUMNS)}, created_at, settled_at) "
    "SELECT u.*, statement_timestamp(), {settled} FROM unnest("
    f"{', '.join(f'%s::{kind}[]' for _, kind, _ in _COLUMNS)}) AS u "
)
# A pending row never replaces anything (a final event may have arrived first).
_INSERT_PENDING = _SELECT.format(settled="NULL") + "ON CONFLICT (request_id) DO NOTHING"
# A final event inserts its row, or finalises the pending one; a final row is never changed.
_KEPT = {"request_id", "tenant_id", "api_key_id", "estimated_tokens"}
_INSERT_FINAL = (
    _SELECT.format(settled="statement_timestamp()")
    + "ON CONFLICT (request_id) DO UPDATE SET "
    + ", ".join(f"{name} = EXCLUDED.{name}" for name, _, _ in _COLUMNS if name not in _KEPT)
    + f", settled_at = EXCLUDED.settled_at WHERE {_TABLE}.status = 'pending'"
)


def write_usage(events: list[UsageEvent]) -> int:
    """Write the events' rows, idempotent on the request id: a pending event inserts a pending
    row unless the request id has a row; a final event inserts its row or finalises the pending
    one, and never changes a final row. So a redelivery, a replay, a reaper racing a late
    consumer, or a pending event arriving after the final one writes nothing. Two statements
    at most per batch (a batch holding both events of a request keeps the final one). Returns
    the number of rows inserted or finalised."""
    finals: dict[str, UsageEvent] = {}
    pendings: dict[str, UsageEvent] = {}
    for event in events:
        (pendings if event.is_pending else finals).setdefault(event.request_id, event)
    pending = [e for rid, e in pendings.items() if rid not in finals]
    written = 0
    with transaction.atomic(), connection.cursor() as cursor:
        for statement, batch in ((_INSERT_PENDING, pending), (_INSERT_FINAL, list(finals.values()))):
            if batch:
                cursor.execute(statement, [[value(e) for e in batch] for _, _, value in _COLUMNS])
                written += cursor.rowcount
    return written


def set_price(model_version, effective_from: datetime, input_per_million, output_per_million,
              cached_input_per_million=None) -> Price:
    """A new price from `effective_from` on (earlier usage keeps the earlier price)."""
    def dec(value):
        return None if value is None else Decimal(str(value))

    return Price.objects.create(
        model_version=model_version, effective_from=effective_from,
        input_per_million=dec(input_per_million), output_per_million=dec(output_per_million),
        cached_input_per_million=dec(cached_input_per_million),
    )
