"""Three node agents (Celery workers on their own queues) on this machine in two zones, starting
real SmolLM2 replicas through replica.launch. The control loops (autoscaler, lost-node check)
are the functions Celery beat runs, ticked here by the test.

A killed agent (and its replicas: the node is gone) is presumed lost, its replica failed and
replaced in the other zone, and no request that had not started is lost meanwhile.
"""
from __future__ import annotations

import os
import signal
import threading

import pytest
from django.conf import settings

from fleet.models import ReplicaTransition
from models_registry.models import Node, Replica, ScalingPolicy
from models_registry.services import ensure_model_version
from tenants.services import create_api_key, create_tenant
from tests.e2e.conftest import LOG_DIR, SMOLLM2_WEIGHTS, platform_env
from tests.support.fleet import Control, Load, start_agents, stop_fleet
from tests.support.billing import priced

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
LOST_AFTER_S = 4.0


def _kill_node(agent, node: Node) -> None:
    """The machine is gone: the agent and every server it ran die at once."""
    server_pids = list(Replica.objects.filter(node=node).exclude(server_pid=None)
                       .values_list("server_pid", flat=True))
    os.killpg(agent.popen.pid, signal.SIGKILL)  # the agent and its launchers
    agent.popen.wait()
    for pid in server_pids:  # tritonserver runs in a session of its own
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_killed_agent_is_replaced_in_the_other_zone_without_losing_requests(
        transactional_db, live_server_url):
    run = settings.REDIS_KEY_PREFIX.strip(":").split("-")[-1]
    version = priced(ensure_model_version("chat-small", 1, SMOLLM2_WEIGHTS, context_length=8192))
    ScalingPolicy.objects.create(model_version=version, min_replicas=2, max_replicas=2,
                                 predictive=False, replica_cpu_slots=1, replica_memory_mib=1024)
    api_key = create_api_key(create_tenant("fleet", "interactive")).raw_key
    env = platform_env()
    layout = {f"{run}-a1": "zone-a", f"{run}-b1": "zone-b", f"{run}-b2": "zone-b"}
    agents = start_agents(layout, env, LOG_DIR)
    control = Control(LOST_AFTER_S)
    load = Load(live_server_url, {"Authorization": f"Bearer {api_key}"})
    threads = [threading.Thread(target=load.run, daemon=True) for _ in range(3)]
    try:
        control.until(lambda: Node.objects.filter(name__in=layout).count() == 3, 120,
                      "three registered nodes", agents.values(), tick=False)
        ready = lambda: Replica.objects.filter(model_version=version, state="ready")  # noqa: E731
        control.until(lambda: ready().count() == 2, 600, "two ready replicas", agents.values())
        assert sorted(ready().values_list("zone", flat=True)) == ["zone-a", "zone-b"]
        first = ready().first()
        assert [t.to_state for t in ReplicaTransition.objects.filter(replica=first)] == ["loading", "ready"]
        assert "warm-up answered" in ReplicaTransition.objects.filter(replica=first).last().reason

        for thread in threads:
            thread.start()
        control.until(lambda: load.served() >= 3, 300, "requests served")
        lost = ready().get(zone="zone-a")
        lost_node = lost.node
        served_before_kill = len(load.outcomes)
        _kill_node(agents.pop(lost_node.name), lost_node)

        def replaced():
            return ready().filter(zone="zone-b").count() == 2
        control.until(replaced, 600, "a ready replacement in zone-b", agents.values())
        control.until(lambda: len(load.outcomes) >= served_before_kill + 6, 300, "requests after")
        load.stop.set()
        for thread in threads:
            thread.join(150)

        lost.refresh_from_db()
        assert lost.state == "failed"
        assert "lost" in ReplicaTransition.objects.filter(replica=lost).last().reason
        replacement = ready().exclude(pk__in=[first.pk, lost.pk]).order_by("-pk").first()
        assert replacement.zone == "zone-b" and replacement.node.name == f"{run}-b2"
        assert Node.objects.get(pk=lost_node.pk).lost_at is not None
        # Every request either finished, or failed only after it had started streaming.
        not_started_and_failed = [o for o in load.outcomes if not o[2] and o[1] == 0]
        assert not_started_and_failed == [], load.outcomes
        assert sum(ok for *_, ok in load.outcomes) > served_before_kill
    finally:
        load.stop.set()
        stop_fleet(agents, layout, control)
