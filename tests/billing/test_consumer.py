"""The consumer against the real Redis stream and PostgreSQL: duplicates, a crash between
write and ack, a dead consumer's pending entries, refused rows."""
import pytest

from billing.models import UsageRecord
from billing.stream import GROUP, StreamKeys, send_batch
from tests.support.billing import drain, event, make_consumer, sync_redis

pytestmark = pytest.mark.django_db(transaction=True)


class Crash(Exception):
    pass


def crash_after_write(point: str) -> None:
    if point == "after_write":
        raise Crash(point)


def publish(events) -> None:
    from django.conf import settings

    send_batch(sync_redis(), StreamKeys(settings.REDIS_KEY_PREFIX), events)


def pending_count() -> int:
    from django.conf import settings

    info = sync_redis().xpending(StreamKeys(settings.REDIS_KEY_PREFIX).stream, GROUP)
    return info["pending"]


def ids(tenant, key, version, n, **kw):
    return [event(tenant.pk, key.pk, version.pk, **kw) for _ in range(n)]


def test_duplicates_are_billed_once(account, model_version):
    tenant, key = account
    events = ids(tenant, key, model_version, 20)
    publish(events + events[:7] + events[:3])  # redeliveries and replays
    assert drain() == 30
    assert UsageRecord.objects.count() == 20
    assert sum(r.output_tokens for r in UsageRecord.objects.all()) == 20 * 5


def test_crash_between_write_and_ack_then_restart(account, model_version):
    tenant, key = account
    events = ids(tenant, key, model_version, 50)
    publish(events)
    doomed = make_consumer("a", crash_hook=crash_after_write, batch_size=20)
    with pytest.raises(Crash):
        doomed.step(block_ms=0)
    assert UsageRecord.objects.count() == 20  # written, not acknowledged
    assert pending_count() == 20
    # The same consumer restarted reads its own pending entries first.
    drain(make_consumer("a", batch_size=20))
    assert UsageRecord.objects.count() == 50
    assert pending_count() == 0


def test_live_consumer_claims_a_dead_consumers_entries(account, model_version):
    tenant, key = account
    publish(ids(tenant, key, model_version, 30))
    doomed = make_consumer("dead", crash_hook=crash_after_write, batch_size=30)
    with pytest.raises(Crash):
        doomed.step(block_ms=0)
    live = make_consumer("live", claim_idle_ms=0)
    drain(live)
    assert UsageRecord.objects.count() == 30
    assert pending_count() == 0


def test_refused_rows_are_dead_lettered_and_the_rest_written(account, model_version):
    from django.conf import settings

    tenant, key = account
    good = ids(tenant, key, model_version, 5)
    bad = event(tenant.pk + 10_000, key.pk, model_version.pk)  # no such tenant
    publish(good[:2] + [bad] + good[2:])
    drain()
    assert UsageRecord.objects.count() == 5
    assert pending_count() == 0
    keys = StreamKeys(settings.REDIS_KEY_PREFIX)
    assert sync_redis().xlen(keys.dead_letters) == 1
    assert sync_redis().xlen(keys.stream) == 0  # acknowledged entries are deleted


def test_prices_apply_by_event_time_not_arrival(account, model_version):
    tenant, key = account
    publish([event(tenant.pk, key.pk, model_version.pk, occurred_at=1_700_000_000.5)])
    drain()
    row = UsageRecord.objects.get()
    assert row.occurred_at.timestamp() == 1_700_000_000.5


def test_a_value_postgresql_cannot_store_is_dead_lettered(account, model_version):
    tenant, key = account
    good = event(tenant.pk, key.pk, model_version.pk)
    publish([good, event(tenant.pk, key.pk, model_version.pk, input_tokens=2**40),
             event(tenant.pk, key.pk, model_version.pk, output_tokens=-1)])
    drain()
    assert list(UsageRecord.objects.values_list("request_id", flat=True)) == [good.request_id]
    assert pending_count() == 0


def test_postgresql_failure_leaves_entries_pending(account, model_version):
    from django.db import OperationalError

    tenant, key = account
    publish([event(tenant.pk, key.pk, model_version.pk) for _ in range(4)])

    def database_down(events):
        raise OperationalError("connection refused")

    with pytest.raises(OperationalError):
        make_consumer("a", write=database_down).step(block_ms=0)
    assert pending_count() == 4
    drain(make_consumer("a"))
    assert UsageRecord.objects.count() == 4 and pending_count() == 0
