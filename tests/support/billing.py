"""Test helpers for metering: a consumer over this run's stream, and events."""
from __future__ import annotations

import itertools

import redis
from django.conf import settings

from billing.consumer import UsageConsumer
from billing.events import UsageEvent
from billing.outbox import FileOutbox
from billing.stream import StreamKeys


def priced(model_version):
    """`model_version` with a price in effect since 2000 (a version without one may not serve:
    placement and rollouts refuse it). Returns the version."""
    from datetime import datetime, timezone

    from billing.models import Price
    from billing.services import set_price

    if not Price.objects.filter(model_version=model_version).exists():
        set_price(model_version, datetime(2000, 1, 1, tzinfo=timezone.utc), "1", "2")
    return model_version


def sync_redis(url: str | None = None) -> redis.Redis:
    return redis.Redis.from_url(url or settings.REDIS_URL)


def make_consumer(name: str = "test-consumer", client: redis.Redis | None = None,
                  **kwargs) -> UsageConsumer:
    kwargs.setdefault("outbox", FileOutbox(settings.BILLING_OUTBOX_DIR))
    consumer = UsageConsumer(client or sync_redis(), StreamKeys(settings.REDIS_KEY_PREFIX), name,
                             **kwargs)
    consumer.ensure_group()
    return consumer


def drain(consumer: UsageConsumer | None = None, max_steps: int = 1000) -> int:
    """Replay the outbox and consume until the stream has nothing left; returns entries seen."""
    consumer = consumer or make_consumer()
    consumer.ensure_group()
    total = consumer.replay_outbox()
    for _ in range(max_steps):
        handled = consumer.step(block_ms=0)
        if not handled:
            return total
        total += handled
    raise AssertionError("the usage stream did not drain")


_ids = itertools.count()


def event(tenant_id: int, api_key_id: int, model_version_id: int, *, request_id: str | None = None,
          input_tokens: int = 10, cached_tokens: int = 0, output_tokens: int = 5,
          occurred_at: float = 1_790_000_000.0, status: str = "ok") -> UsageEvent:
    return UsageEvent(
        request_id=request_id or f"req-{next(_ids)}", tenant_id=tenant_id,
        api_key_id=api_key_id, model_name="chat-small", model_version_id=model_version_id,
        replica_id=None, input_tokens=input_tokens, cached_tokens=cached_tokens,
        output_tokens=output_tokens, ttft_ms=12.5, total_ms=40.0, status=status,
        finish_reason="stop", endpoint="generate", occurred_at=occurred_at,
    )


def reset_usage_stream() -> None:
    """Each test starts with an empty stream, group and outbox (rows of earlier tests' tenants
    would otherwise be dead-lettered by this test's consumer)."""
    import shutil

    keys = StreamKeys(settings.REDIS_KEY_PREFIX)
    client = sync_redis()
    try:
        client.delete(keys.stream, keys.dead_letters)
    finally:
        client.close()
    shutil.rmtree(settings.BILLING_OUTBOX_DIR, ignore_errors=True)
