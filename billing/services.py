"""Billing writes. `record_usage` is the request path's one call (it appends to the usage
stream); `write_usage` is the consumer's (PostgreSQL, idempotent on the request id)."""
from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from decimal import Decimal

from django.apps import apps
from django.db import transaction

from billing.events import UsageEvent
from billing.models import Price, UsageRecord

__all__ = ["UsageEvent", "record_usage", "write_usage", "set_price"]


def current_recorder():
    """The per-event-loop UsageRecorder (an async Redis client belongs to its loop), kept on the
    billing AppConfig rather than in a module global; tests may replace `recorder_factory`."""
    config = apps.get_app_config("billing")
    loop = asyncio.get_running_loop()
    recorder = config.recorders.get(loop)
    if recorder is None:
        recorder = config.recorder_factory()
        config.recorders[loop] = recorder
    return recorder


async def record_usage(event: UsageEvent) -> None:
    """Record one finished request: onto the usage stream, or the local outbox when Redis is
    unreachable. Returns once the event is durable in one of them."""
    await current_recorder().record(event)


def _row(event: UsageEvent) -> UsageRecord:
    return UsageRecord(
        request_id=event.request_id,
        tenant_id=event.tenant_id,
        api_key_id=event.api_key_id,
        model_name=event.model_name,
        model_version_id=event.model_version_id,
        replica_id=event.replica_id,
        input_tokens=event.input_tokens,
        cached_tokens=event.cached_tokens,
        output_tokens=event.output_tokens,
        ttft_ms=event.ttft_ms,
        total_ms=event.total_ms,
        status=event.status,
        finish_reason=event.finish_reason,
        endpoint=event.endpoint,
        occurred_at=datetime.fromtimestamp(event.occurred_at or 0.0, tz=timezone.utc),
    )


def write_usage(events: list[UsageEvent]) -> None:
    """Insert the events' rows in one transaction; request ids already present are skipped
    (INSERT ... ON CONFLICT DO NOTHING), so a redelivery or a replay writes nothing."""
    if not events:
        return
    with transaction.atomic():
        UsageRecord.objects.bulk_create([_row(e) for e in events], ignore_conflicts=True)


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
