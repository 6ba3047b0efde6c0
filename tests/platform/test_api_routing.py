"""Routing through the API against fake Triton replicas: retries, the circuit breaker, a
mid-stream failure's usage row, and the routing metrics on /metrics."""
import json
import re

import pytest
from asgiref.sync import sync_to_async

from billing.models import UsageRecord
from inference.container import current_container
from inference.router import OutstandingTokens
from models_registry.services import register_replica
from tests.support.billing import drain

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


async def post(client, body, headers, path="/v1/chat/completions"):
    return await client.post(path, data=json.dumps(body), content_type="application/json",
                             headers=headers)


def sample(metrics: str, name: str, **labels) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} {labels} in:\n{metrics}")


async def test_dead_replica_retries_then_its_circuit_opens(client, auth, ready_replica,
                                                          fake_replica, model_version):
    dead = await sync_to_async(register_replica)(model_version, "127.0.0.1:1")
    container = current_container()
    # The good replica looks busy, so every policy tries the idle-looking dead one first.
    counter = OutstandingTokens(container.redis, container.key_prefix)
    await counter.add(model_version.pk, ready_replica.pk, 1_000_000)
    threshold = container.router.state.circuit.failure_threshold
    for _ in range(threshold + 2):
        response = await post(client, BODY, auth)
        assert response.status_code == 200, response.content
    # Retried `threshold` times; then the circuit is open and the dead one gets nothing.
    assert fake_replica.state.num_requests == threshold + 2
    metrics = (await client.get("/metrics")).content.decode()
    mv = model_version.pk
    assert sample(metrics, "llmp_router_retries_total", replica=dead.pk, policy="balanced") \
        == threshold
    assert sample(metrics, "llmp_router_requests_routed_total", replica=dead.pk) == threshold
    assert sample(metrics, "llmp_router_requests_routed_total",
                  replica=ready_replica.pk) == threshold + 2
    assert sample(metrics, "llmp_router_circuit_opened_total", replica=dead.pk) == 1
    assert sample(metrics, "llmp_router_circuit_state", model_version=mv, replica=dead.pk) == 1
    assert sample(metrics, "llmp_router_circuit_state", replica=ready_replica.pk) == 0
    assert sample(metrics, "llmp_router_prompt_tokens_total", replica=ready_replica.pk) > 0
    # Prometheus text: each family's samples follow its own TYPE line.
    families = re.findall(r"^# TYPE (\S+)", metrics, re.M)
    assert len(families) == len(set(families))


async def test_mid_stream_failure_is_an_error_event_and_a_failed_usage_row(client, auth,
                                                                          ready_replica):
    body = {**BODY, "stream": True, "messages": [{"role": "user", "content": "[die-after-2]"}]}
    response = await post(client, body, auth, path="/v1/generate")
    payload = b"".join([c async for c in response.streaming_content]).decode()
    assert payload.count("event: token") == 2 and "event: error" in payload
    await sync_to_async(drain)()
    row = await UsageRecord.objects.aget()
    assert (row.status, row.output_tokens, row.replica_id) == ("failed", 2, ready_replica.pk)
    metrics = (await client.get("/metrics")).content.decode()
    assert sample(metrics, "llmp_router_replica_failures_total", replica=ready_replica.pk) == 1
    # It had started: no retry (counters exist only once they count something).
    assert f'llmp_router_retries_total{{model_version="{ready_replica.model_version_id}",' \
        f'replica="{ready_replica.pk}"' not in metrics
