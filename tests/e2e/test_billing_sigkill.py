"""SIGKILL the API process (daphne) mid-stream: the usage row holds what the replica computed.

Real parts: daphne serving the platform, the real SmolLM2 replica in tritonserver, PostgreSQL,
Redis, the billing consumer and the reaper. The replica's own counters are the reference:
the row's input and output tokens equal the growth of `replica_prompt_tokens_total` and
`replica_generated_tokens_total` over the request (the replica serves nothing else meanwhile).
"""
import json
import os
import re
import signal

import httpx
import pytest
import redis
from django.conf import settings
from django.utils import timezone

from billing.leases import held_leases, lease_key
from billing.models import UsageRecord
from billing.reaper import reap_pending_usage
from inference.usage_reaping import ask_replicas
from replica.metric_names import GENERATED_TOKENS, PROMPT_TOKENS
from tenants.services import create_api_key, create_tenant
from tests.e2e.conftest import daphne_server, platform_env, register_chat_small
from tests.support.billing import drain, reset_usage_stream
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def counter(metrics_address: str, name: str) -> float:
    text = httpx.get(f"http://{metrics_address}/metrics", timeout=5).text
    match = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert match, f"no {name} on the replica's metrics port"
    return float(match.group(1))


@pytest.mark.parametrize("replica_server", ["smollm2"], indirect=True)
def test_sigkill_of_the_api_mid_stream_bills_what_the_replica_computed(transactional_db,
                                                                       replica_server):
    reset_usage_stream()
    tenant = create_tenant("doomed", "interactive")
    register_chat_small(replica_server)
    key = create_api_key(tenant).raw_key
    metrics = replica_server.metrics_address
    prompt_before = counter(metrics, PROMPT_TOKENS)
    generated_before = counter(metrics, GENERATED_TOKENS)
    body = {"model": "chat-small", "stream": True, "max_tokens": 2000, "temperature": 0.0,
            "messages": [{"role": "user", "content": "Count from one to one thousand."}]}
    env = platform_env(BILLING_LEASE_TTL_SECONDS="1")
    with daphne_server("daphne-sigkill", env) as (url, proc):
        num_seen = 0
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120,
                          headers={"Authorization": f"Bearer {key}"}) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if line.startswith("data: {") and json.loads(line[6:])["choices"]:
                    num_seen += 1
                if num_seen >= 3:
                    os.kill(proc.popen.pid, signal.SIGKILL)  # mid-stream, no clean-up at all
                    proc.popen.wait(30)
                    break
    request_ids = []
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        # The replica sees the broken stream, aborts the request and goes idle.
        wait_until(lambda: replica_server.active_seqs() == 0, 120, "replica idle", period_s=0.1)
        drain()  # the pending event daphne sent at admission
        pending = list(UsageRecord.objects.filter(tenant=tenant))
        assert [r.status for r in pending] == ["pending"]
        request_ids = [pending[0].request_id]
        wait_until(lambda: not client.exists(lease_key(settings.REDIS_KEY_PREFIX, request_ids[0])),
                   30, "lease expiry", period_s=0.1)
        result = reap_pending_usage(
            timezone.now(), ask_replicas,
            lambda ids: held_leases(client, settings.REDIS_KEY_PREFIX, ids),
            min_age_s=0.0, give_up_s=3600.0)
    finally:
        client.close()
    assert result.finalised == 1
    row = UsageRecord.objects.get(request_id=request_ids[0])
    prompt_computed = counter(metrics, PROMPT_TOKENS) - prompt_before
    generated = counter(metrics, GENERATED_TOKENS) - generated_before
    assert row.status == "cancelled"
    assert (row.input_tokens, row.output_tokens) == (prompt_computed, generated)
    assert row.output_tokens >= num_seen > 0 and row.input_tokens > 0
    assert row.estimated_tokens == row.input_tokens + 2000
    # Reaping again, or the consumer seeing a late event, bills nothing more.
    assert reap_pending_usage(timezone.now(), ask_replicas, lambda ids: set(),
                              min_age_s=0.0, give_up_s=3600.0).finalised == 0

