"""A tensor-parallel version (tensor_parallel_degree=2) through the fleet: a node agent places
ONE replica (tritonserver + one gloo worker process), the health check finds it ready, the
platform's API answers from it, and a drain stops the replica and its worker together."""
from __future__ import annotations

import os
import signal

import httpx
import psutil
import pytest
from django.utils import timezone

from fleet.models import ReplicaTransition
from fleet.placement import drain_replicas
from models_registry.models import ModelVersion, Replica, ScalingPolicy
from models_registry.services import ensure_model_version
from tenants.services import create_api_key, create_tenant
from tests.e2e.conftest import LOG_DIR, SMOLLM2_WEIGHTS, platform_env
from tests.support.billing import priced
from tests.support.fleet import Control, start_agents, stop_fleet
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def _workers(server_pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(server_pid).children(recursive=True)
            if "replica.engine.parallel.worker" in " ".join(p.cmdline())]


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_tensor_parallel_version_is_placed_checked_served_and_drained_as_one_replica(
        transactional_db, live_server_url):
    version = priced(ensure_model_version("chat-tp", 1, SMOLLM2_WEIGHTS, context_length=8192))
    ModelVersion.objects.filter(pk=version.pk).update(tensor_parallel_degree=2)
    ScalingPolicy.objects.create(model_version=version, min_replicas=1, max_replicas=1, predictive=False,
                                 replica_cpu_slots=1, replica_memory_mib=1024)
    api_key = create_api_key(create_tenant("tp", "interactive")).raw_key
    name = f"tp-{os.getpid()}"
    agents = start_agents({name: "zone-a"}, platform_env(), LOG_DIR, cpu_slots=2)
    control = Control(lost_after_s=30.0)
    try:
        ready = lambda: Replica.objects.filter(model_version=version, state="ready")  # noqa: E731
        control.until(lambda: ready().count() == 1, 600, "one ready tensor-parallel replica", agents.values())
        replica = ready().get()
        assert replica.cpu_slots == 2  # one slot per rank on a CPU node
        assert "warm-up answered" in ReplicaTransition.objects.filter(replica=replica).last().reason
        (worker,) = _workers(replica.server_pid)

        body = {"model": "chat-tp", "prompt": "The three primary colours are", "max_tokens": 8,
                "temperature": 0}
        answer = httpx.post(f"{live_server_url}/v1/completions", json=body, timeout=120,
                            headers={"Authorization": f"Bearer {api_key}"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 8

        drain_replicas(version, 1, now=timezone.now(), reason="test drain", dispatcher=control.ctx.dispatcher,
                       outstanding={})
        control.until(lambda: Replica.objects.get(pk=replica.pk).state == "stopped", 180,
                      "the drained replica to stop", agents.values(), tick=False)
        wait_until(lambda: _gone(worker), 60, "the worker to stop with its replica")
        states = [t.to_state for t in ReplicaTransition.objects.filter(replica=replica)]
        assert states[-2:] == ["draining", "stopped"], states
    finally:
        for agent in agents.values():
            if agent.popen.poll() is None:
                agent.popen.send_signal(signal.SIGTERM)
        stop_fleet(agents, [name], control)
