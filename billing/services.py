"""Billing writes. `record_usage` is the request path's one call (it appends to the usage
stream); `write_usage` is the consumer's (PostgreSQL, idempotent on the request id)."""
from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

from django.apps import apps
from django.db import connection, transaction

from billing.events import UsageEvent
from billing.models import Price, UsageRecord

__all__ = ["UsageEvent", "record_usage", "write_usage", "set_price"]


def current_recorder():
    """The per-event-loop UsageRecorder (an async Redis client belongs to its loop), kept on the
    billing AppConfig rather than in a module global; tests may replace `recorders.factory`."""
    return apps.get_app_config("billing").recorders.current()


async def record_usage(event: UsageEvent) -> None:
    """Record one finished request: onto the usage stream, or the local outbox when Redis is
    unreachable. Returns once the event is durable in one of them."""
    await current_recorder().record(event)


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
    ("ttft_ms", "float8", lambda e: e.ttft_ms),
    ("total_ms", "float8", lambda e: e.total_ms),
    ("status", "varchar", lambda e: e.status),
    ("finish_reason", "varchar", lambda e: e.finish_reason),
    ("endpoint", "varchar", lambda e: e.endpoint),
    ("occurred_at", "timestamptz",
     lambda e: datetime.fromtimestamp(e.occurred_at or 0.0, tz=timezone.utc)),
]
# One statement per batch, whatever its size: the columns travel as arrays (unnest), so the
# consumer pays one round trip and no per-row SQL compilation.
_INSERT = (
    f"INSERT INTO {UsageRecord._meta.db_table} "
    f"({', '.join(name for name, _, _ in _COLUMNS)}, created_at) "
    f"SELECT u.*, statement_timestamp() FROM unnest("
    f"{', '.join(f'%s::{kind}[]' for _, kind, _ in _COLUMNS)}) AS u "
    "ON CONFLICT (request_id) DO NOTHING"
)


def write_usage(events: list[UsageEvent]) -> int:
    """Insert the events' rows in one statement; request ids already present are skipped
    (INSERT ... ON CONFLICT DO NOTHING), so a redelivery or a replay writes nothing. Returns
    the number of rows inserted."""
    if not events:
        return 0
    params = [[value(e) for e in events] for _, _, value in _COLUMNS]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_INSERT, params)
        return cursor.rowcount


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
