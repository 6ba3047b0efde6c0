"""The single write path for usage. Issue 7 replaces the body with a Redis-stream append; its
callers do not change."""
from __future__ import annotations

from dataclasses import dataclass

from billing.models import UsageRecord


@dataclass(frozen=True)
class UsageEvent:
    request_id: str
    tenant_id: int
    api_key_id: int
    model_name: str
    model_version_id: int
    replica_id: int | None
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_ms: float | None
    total_ms: float
    status: str  # one of UsageRecord.Status
    finish_reason: str = ""
    endpoint: str = ""


async def record_usage(event: UsageEvent) -> None:
    """Record one finished request. Idempotent on `request_id` (a replay writes nothing):
    one INSERT ... ON CONFLICT DO NOTHING."""
    record = UsageRecord(
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
    )
    await UsageRecord.objects.abulk_create([record], ignore_conflicts=True)
