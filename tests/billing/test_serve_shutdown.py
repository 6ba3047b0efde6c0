"""`make serve`'s shutdown: the API stops first and the billing consumer last, after a final
drain; its private Redis keeps the usage stream across a restart."""
import subprocess
import sys

import pytest
import redis
from django.conf import settings

from scripts.serve import STOP_ORDER, Supervisor
from scripts.services import start_embedded_redis
from tests.support.billing import event, make_consumer, sync_redis
from billing.models import UsageRecord
from billing.stream import StreamKeys, send_batch


def test_the_api_stops_first_and_the_consumer_last(tmp_path):
    stopped = tmp_path / "stopped"
    # Each child appends its name on SIGTERM; the supervisor waits for one before the next.
    script = ("import signal, sys\n"
              "def bye(*_):\n"
              f"    open({str(stopped)!r}, 'a').write(sys.argv[1] + '\\n'); sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, bye)\n"
              "print('up', flush=True)\n"
              "while True: signal.pause()\n")  # until SIGTERM
    supervisor = Supervisor({})
    for name in ("node-agent", "api", "billing-consumer", "celery-worker", "celery-beat"):
        proc = subprocess.Popen([sys.executable, "-c", script, name], stdout=subprocess.PIPE,
                                start_new_session=True)
        assert proc.stdout.readline() == b"up\n"  # its handler is installed
        supervisor.procs.append((name, proc))
    supervisor.stop_all()
    assert stopped.read_text().split() == list(STOP_ORDER)
    assert STOP_ORDER[0] == "api" and STOP_ORDER[-1] == "billing-consumer"


def test_the_private_redis_keeps_the_stream_across_a_restart(tmp_path):
    url, proc = start_embedded_redis(tmp_path)
    try:
        client = redis.Redis.from_url(url)
        client.xadd("billing:usage", {"e": "one"})
        client.close()
    finally:
        proc.terminate()
        proc.wait(30)
    url, proc = start_embedded_redis(tmp_path)
    try:
        client = redis.Redis.from_url(url)
        assert [fields for _, fields in client.xrange("billing:usage")] == [{b"e": b"one"}]
        client.close()
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.django_db(transaction=True)
def test_the_consumer_drains_the_stream_on_its_way_out(account, model_version):
    tenant, key = account
    consumer = make_consumer("finisher", batch_size=3)
    client = sync_redis()
    try:
        send_batch(client, StreamKeys(settings.REDIS_KEY_PREFIX),
                   [event(tenant.pk, key.pk, model_version.pk) for _ in range(7)])
    finally:
        client.close()
    assert consumer.finish(deadline_s=30) == 7
    assert UsageRecord.objects.count() == 7
