import itertools
from datetime import datetime, timedelta, timezone

import pytest
import redis
from django.conf import settings

from billing.models import UsageRecord
from models_registry.models import ModelVersion
from inference.fallbacks import fallbacks_key
from models_registry.services import ensure_model_version
from tenants.services import create_api_key, create_tenant
from tests.support.billing import priced

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=timezone.utc)
_ids = itertools.count()


class Clock:
    """An injected wall clock the test moves by hand."""

    def __init__(self, now: datetime = T0):
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sync_redis():
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    for key in client.scan_iter(match=settings.REDIS_KEY_PREFIX + "rollout:*"):
        client.delete(key)
    client.close()


@pytest.fixture
def versions(db) -> tuple[ModelVersion, ModelVersion]:
    stable = ensure_model_version("chat-small", 1, "fake-1", tokenizer="bytes")
    canary = priced(ensure_model_version("chat-small", 2, "fake-2", tokenizer="bytes",
                                         state="staging"))
    return stable, canary


@pytest.fixture
def key(db):
    tenant = create_tenant("acme", "interactive")
    return create_api_key(tenant).api_key


@pytest.fixture
def usage(key):
    """usage(version, n, at=, status=, ttft_ms=, tpot_ms=): n usage rows of that version."""

    def add(version, n: int, *, at: datetime, status: str = "ok", ttft_ms: float = 100.0,
            tpot_ms: float = 20.0, output_tokens: int = 11) -> None:
        UsageRecord.objects.bulk_create([
            UsageRecord(request_id=f"r{next(_ids)}", tenant_id=key.tenant_id, api_key=key,
                        model_name="chat-small", model_version=version, input_tokens=10,
                        output_tokens=output_tokens if status == "ok" else 0,
                        ttft_ms=ttft_ms if status == "ok" else None,
                        total_ms=ttft_ms + tpot_ms * (output_tokens - 1), status=status,
                        occurred_at=at)
            for _ in range(n)])

    return add


def add_fallbacks(client, rollout_id: int, reason: str, at: datetime, n: int) -> None:
    client.hincrby(fallbacks_key(settings.REDIS_KEY_PREFIX, rollout_id),
                   f"{reason}:{int(at.timestamp() // 60)}", n)
