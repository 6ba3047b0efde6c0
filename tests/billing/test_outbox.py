"""The outbox: Redis unreachable -> events fsynced locally -> replayed -> billed once."""
import asyncio
import time

import pytest
import redis.asyncio as aioredis
from django.conf import settings

from billing.models import UsageRecord
from billing.outbox import FileOutbox
from billing.stream import StreamKeys, UsageRecorder
from scripts.services import free_port
from tests.support.billing import drain, event

pytestmark = pytest.mark.django_db(transaction=True)


def recorder_to(url: str) -> UsageRecorder:
    client = aioredis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    return UsageRecorder(client, StreamKeys(settings.REDIS_KEY_PREFIX),
                         FileOutbox(settings.BILLING_OUTBOX_DIR), time.time)


def test_unreachable_redis_goes_to_the_outbox_and_is_replayed(account, model_version):
    tenant, key = account
    events = [event(tenant.pk, key.pk, model_version.pk) for _ in range(25)]

    async def send_all():
        recorder = recorder_to(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
        try:
            for e in events:
                await recorder.record(e)
        finally:
            await recorder.close()

    asyncio.run(send_all())
    outbox = FileOutbox(settings.BILLING_OUTBOX_DIR)
    assert outbox.has_pending()
    assert UsageRecord.objects.count() == 0
    drain()  # replays the outbox into the stream, then consumes
    assert UsageRecord.objects.count() == 25
    assert not outbox.has_pending()


def test_replaying_twice_and_a_torn_line_bill_once(account, model_version, tmp_path):
    tenant, key = account
    outbox = FileOutbox(tmp_path)
    events = [event(tenant.pk, key.pk, model_version.pk) for _ in range(10)]
    outbox.append(events)
    with open(tmp_path / "outbox.jsonl", "ab") as f:
        f.write(b'{"v":1,"request_id":"torn"')  # a crash mid-write
    sent: list = []

    def send_then_crash(batch):
        sent.extend(batch)
        raise ConnectionError("redis went away mid-replay")

    with pytest.raises(ConnectionError):
        outbox.replay(send_then_crash, batch_size=4)
    assert outbox.has_pending()  # the file is kept until every event was sent
    outbox.append(events[:3])  # more arrive meanwhile (and duplicates of sent ones)
    replayed: list = []
    assert outbox.replay(replayed.extend) == 13
    assert not outbox.has_pending()
    assert {e.request_id for e in replayed} == {e.request_id for e in events}


def test_after_a_failure_redis_is_not_tried_until_the_retry_time(account, model_version):
    tenant, key = account
    now = [1000.0]

    class FlakyClient:
        num_calls = 0
        up = False

        async def xadd(self, stream, fields):
            self.num_calls += 1
            if not self.up:
                raise ConnectionError("refused")

    client = FlakyClient()
    recorder = UsageRecorder(client, StreamKeys(settings.REDIS_KEY_PREFIX),
                             FileOutbox(settings.BILLING_OUTBOX_DIR), lambda: now[0],
                             retry_after_s=1.0)

    async def record(n):
        for _ in range(n):
            await recorder.record(event(tenant.pk, key.pk, model_version.pk, occurred_at=None))

    asyncio.run(record(5))
    assert client.num_calls == 1  # one failure, then straight to the outbox
    client.up = True
    now[0] += 1.0
    asyncio.run(record(3))
    assert client.num_calls == 4
    drain()  # the 5 outbox events (the 3 others went to a fake client, not Redis)
    assert UsageRecord.objects.count() == 5
    assert {r.occurred_at.timestamp() for r in UsageRecord.objects.all()} == {1000.0}
