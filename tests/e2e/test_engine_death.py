"""The whole chain on real parts: daphne, a node agent running a real SmolLM2 replica through
replica.launch, the autoscaler and the health check (the functions Celery beat runs, ticked by
the test), the official `openai` client.

Extreme sampling values through the API are served and the replica goes on. Then its engine
loop is killed (fault injection, as a bug would kill it): Triton's model readiness turns false,
the health check marks the replica failed, and the autoscaler places a replacement at once
that serves the next request.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import openai
import pytest
import tritonclient.grpc.aio as triton_aio
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections

from fleet.health_check import check_replicas
from fleet.lifecycle import history
from models_registry.models import Node, Replica, ScalingPolicy
from models_registry.services import ensure_model_version
from tenants.services import create_api_key, create_tenant
from tests.e2e.conftest import LOG_DIR, SMOLLM2_WEIGHTS, platform_env
from tests.support.billing import priced
from tests.support.fleet import Control, start_agents, stop_fleet
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
MESSAGES = [{"role": "user", "content": "Say hello."}]


async def _model_ready(address: str, model: str) -> bool:
    client = triton_aio.InferenceServerClient(address)
    try:
        return bool(await asyncio.wait_for(client.is_model_ready(model), 2.0))
    except Exception:  # noqa: BLE001 - refused, unreachable: not ready
        return False
    finally:
        await client.close()


async def _health_check() -> dict[int, str]:
    try:
        return await check_replicas()
    finally:  # the async ORM's worker thread keeps a connection: the test database must drop
        await sync_to_async(connections.close_all)()


def test_extreme_values_are_served_and_a_dead_engine_is_failed_and_replaced(transactional_db, live_server_url):
    run = settings.REDIS_KEY_PREFIX.strip(":").split("-")[-1]
    version = priced(ensure_model_version("chat-small", 1, SMOLLM2_WEIGHTS, context_length=8192))
    ScalingPolicy.objects.create(model_version=version, min_replicas=1, max_replicas=1, predictive=False,
                                 replica_cpu_slots=1, replica_memory_mib=1024)
    api_key = create_api_key(create_tenant("faults", "interactive")).raw_key
    layout = {f"{run}-e1": "zone-a"}
    agents = start_agents(layout, platform_env(), LOG_DIR)
    control = Control(lost_after_s=60.0)
    client = openai.OpenAI(base_url=live_server_url + "/v1", api_key=api_key, max_retries=0, timeout=120)
    ready = lambda: Replica.objects.filter(model_version=version, state="ready")  # noqa: E731
    try:
        control.until(lambda: Node.objects.filter(name__in=layout).count() == 1, 120, "a registered node",
                      agents.values(), tick=False)
        control.until(lambda: ready().count() == 1, 600, "a ready replica", agents.values())
        first = ready().get()

        extreme = [{"temperature": 1e-45}, {"temperature": 5e-324, "top_p": 1e-45},
                   {"temperature": 2.0, "top_p": 1e-45}, {"temperature": 2.0, "seed": 2**63 - 1}]
        for params in extreme:
            reply = client.chat.completions.create(model="chat-small", messages=MESSAGES, max_tokens=4, **params)
            assert reply.choices[0].finish_reason in ("length", "stop") and reply.usage.completion_tokens >= 1
        normal = client.chat.completions.create(model="chat-small", messages=MESSAGES, max_tokens=4)
        assert normal.choices[0].message.content
        first.refresh_from_db()
        assert first.state == "ready"

        # The engine loop dies as a bug would kill it (the model's fault file, in the server's cwd).
        workdir = Path(f"/proc/{first.server_pid}/cwd").resolve()
        (workdir / "fault").write_text("chaos\n")
        killed = time.monotonic()
        wait_until(lambda: not asyncio.run(_model_ready(first.grpc_address, "chat-small")), 30,
                   "the model not ready after its engine died", period_s=0.05)
        not_ready_s = time.monotonic() - killed
        assert asyncio.run(_health_check())[first.pk] == "failed"
        failed_s = time.monotonic() - killed
        reasons = [reason for _, to_state, reason in history(first.pk) if to_state == "failed"]
        assert reasons and any(r.startswith(("health check", "process exited with code 3")) for r in reasons), reasons

        control.until(lambda: Replica.objects.filter(model_version=version, state__in=("loading", "ready"))
                      .exclude(pk=first.pk).exists(), 60, "a replacement placed", agents.values(), period_s=0.2)
        placed_s = time.monotonic() - killed
        control.until(lambda: ready().exclude(pk=first.pk).exists(), 600, "a ready replacement", agents.values())
        ready_s = time.monotonic() - killed
        deadline = time.monotonic() + 60
        while True:  # daphne re-reads the ready replicas within its directory TTL
            try:
                after = client.chat.completions.create(model="chat-small", messages=MESSAGES, max_tokens=4)
                break
            except openai.APIStatusError:
                assert time.monotonic() < deadline, "no request served after the replacement was ready"
                time.sleep(0.5)  # a client retrying after a 503
        assert after.choices[0].message.content
        print(f"engine killed -> model not ready {not_ready_s:.2f} s, failed {failed_s:.2f} s, "
              f"replacement placed {placed_s:.2f} s, ready {ready_s:.1f} s")
    finally:
        stop_fleet(agents, layout, control)
