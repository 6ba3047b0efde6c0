"""The dashboard's latest hours come from the usage rows, older hours from the roll-ups: a
request is visible before any roll-up, and a stale roll-up of a live hour is not counted twice."""
from datetime import datetime, timedelta, timezone

import pytest

from billing.models import UsageHourly
from billing.rollups import rollup_usage
from billing.services import write_usage
from dashboard.live_usage import live_start
from dashboard.selectors import RANGES, periods, totals_since, usage_points
from tenants.services import create_api_key
from tests.support.billing import event

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime(2026, 11, 30, 15, 20, tzinfo=timezone.utc)


def usage(tenant, model_version, at: datetime, num: int = 1, ttft_ms: float = 10.0):
    key = create_api_key(tenant).api_key
    events = [event(tenant.pk, key.pk, model_version.pk, input_tokens=100, output_tokens=20,
                    occurred_at=at.timestamp()) for _ in range(num)]
    write_usage([e.__class__(**{**e.__dict__, "ttft_ms": ttft_ms}) for e in events])


def points_by_period(tenant, range_key="24h"):
    usage_range = RANGES[range_key]
    xs = periods(usage_range, NOW)
    return {p.period: p for p in usage_points(tenant.pk, xs[0], xs[-1] + usage_range.step,
                                              usage_range.granularity, now=NOW)}


def test_a_request_seconds_ago_shows_before_any_rollup(tenant_a, model_version):
    usage(tenant_a, model_version, NOW - timedelta(seconds=5), num=2, ttft_ms=30.0)
    assert UsageHourly.objects.count() == 0
    point = points_by_period(tenant_a)[NOW.replace(minute=0)]
    assert (point.num_requests, point.num_tokens, point.ttft_p50_ms) == (2, 240, 30.0)
    totals = totals_since(tenant_a.pk, NOW.replace(day=1, hour=0, minute=0), now=NOW)
    assert (totals.num_requests, totals.input_tokens, totals.output_tokens) == (2, 200, 40)


def test_stale_rollups_of_live_hours_are_not_counted_twice(tenant_a, model_version):
    old = NOW - timedelta(hours=5)
    usage(tenant_a, model_version, old, num=3)
    usage(tenant_a, model_version, NOW - timedelta(minutes=1), num=1)
    rollup_usage(NOW, timedelta(days=1))  # rolls up both hours (the live one goes stale)
    usage(tenant_a, model_version, NOW - timedelta(seconds=1), num=1)
    assert UsageHourly.objects.count() == 2
    points = points_by_period(tenant_a)
    assert points[old.replace(minute=0)].num_requests == 3  # from the roll-up
    assert points[NOW.replace(minute=0)].num_requests == 2  # from the rows, not 1 + 2
    day = points_by_period(tenant_a, "30d")[NOW.replace(hour=0, minute=0)]
    assert day.num_requests == 5
    totals = totals_since(tenant_a.pk, NOW.replace(day=1, hour=0, minute=0), now=NOW)
    assert totals.num_requests == 5
    assert live_start(NOW) == NOW.replace(minute=0) - timedelta(hours=1)
