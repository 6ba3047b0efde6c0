"""The autoscaler on a real fleet: two node agents (Celery workers, `manage.py nodeagent`) in
two zones start real SmolLM2 replicas; the autoscaler tick (`autoscale_all`, what beat runs) is
ticked by the test on the real clock, with short cool-downs in the version's ScalingPolicy.

- warm pool: with min 0 and warm_pool_size 1, one idle ready replica is started and kept;
- up: streaming requests through the platform raise outstanding tokens / queue depth, the
  autoscaler scales to 2, the new replica goes to the other zone, becomes ready and serves;
- down: once idle it scales back to min 1 (a replica goes draining -> stopped), no sooner than
  the down cool-down after the last scale up and the last recommendation of 2;
- no flapping: over the idle ticks the desired count never goes back up.
"""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import httpx
import pytest
from django.conf import settings
from django.utils import timezone

from fleet.models import ReplicaTransition, ScalingDecision
from models_registry.models import Node, Replica, ScalingPolicy
from models_registry.services import ensure_model_version
from tenants.services import create_api_key, create_tenant
from tests.e2e.conftest import LOG_DIR, SMOLLM2_WEIGHTS, platform_env
from tests.support.fleet import Control, Load, start_agents, stop_fleet
from tests.support.billing import priced

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
LOST_AFTER_S = 10.0
UP_COOLDOWN_S = 3.0
DOWN_COOLDOWN_S = 6.0
# Long enough that three concurrent streams hold more outstanding tokens than one replica's target.
BODY = {"model": "chat-small", "stream": True, "max_tokens": 40,
        "messages": [{"role": "user", "content": "Write a short poem about the sea."}]}


def _successes(replica: Replica) -> int:
    """Requests the replica's Triton answered (its warm-up included), from its metrics port."""
    text = httpx.get(f"http://{replica.metrics_address}/metrics", timeout=5).text
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("nv_inference_request_success{"))


def _decisions(version, since):
    return list(ScalingDecision.objects.filter(model_version=version, at__gte=since).order_by("at", "pk"))


def test_autoscaler_scales_up_under_load_and_back_down_when_idle(transactional_db, live_server_url):
    run = settings.REDIS_KEY_PREFIX.strip(":").split("-")[-1]
    version = priced(ensure_model_version("chat-small", 1, SMOLLM2_WEIGHTS, context_length=8192))
    policy = ScalingPolicy.objects.create(
        model_version=version, min_replicas=0, max_replicas=2, warm_pool_size=1, predictive=False,
        target_queue_depth=1, target_outstanding_tokens=48, replica_capacity_rps=50.0,
        scale_up_cooldown_s=UP_COOLDOWN_S, scale_down_cooldown_s=DOWN_COOLDOWN_S,
        replica_cpu_slots=1, replica_memory_mib=1024, default_load_seconds=10.0)
    api_key = create_api_key(create_tenant("autoscale", "interactive")).raw_key
    env = platform_env()
    layout = {f"{run}-a1": "zone-a", f"{run}-b1": "zone-b"}
    # Two slots per node: the zone-a node has room for the second replica too, so its placement
    # in zone-b is the spread-across-zones preference, not a lack of room.
    agents = start_agents(layout, env, LOG_DIR, cpu_slots=2, memory_mib=2048, drain_grace_s=5)
    control = Control(LOST_AFTER_S)
    load = Load(live_server_url, {"Authorization": f"Bearer {api_key}"}, body=BODY)
    threads = [threading.Thread(target=load.run, daemon=True) for _ in range(3)]
    replicas = Replica.objects.filter(model_version=version)
    ready = lambda: replicas.filter(state="ready")  # noqa: E731
    live = lambda: replicas.filter(state__in=("loading", "ready"))  # noqa: E731
    try:
        control.until(lambda: Node.objects.filter(name__in=layout).count() == 2, 120,
                      "two registered nodes", agents.values(), tick=False)

        # Warm pool: no load and min 0, yet one ready replica is started and kept idle.
        control.until(lambda: ready().count() == 1, 300, "a warm replica", agents.values())
        warm = ready().get()
        assert warm.zone == "zone-a"
        answered = _successes(warm)  # its warm-up
        held_since = timezone.now()
        control.until(lambda: timezone.now() - held_since > timedelta(seconds=DOWN_COOLDOWN_S + 1),
                      60, "the warm pool hold")
        held = _decisions(version, held_since)
        assert held and all(d.desired_replicas == 1 and d.readings["needs"] == {} for d in held)
        assert all("warm pool 1" in d.reason for d in held), [d.reason for d in held]
        assert list(ready()) == [warm] and _successes(warm) == answered  # idle all along

        # Up: the rest of the test scales between min 1 and max 2, no pool.
        ScalingPolicy.objects.filter(pk=policy.pk).update(min_replicas=1, warm_pool_size=0)
        for thread in threads:
            thread.start()
        control.until(lambda: live().count() == 2, 120, "a scale up under load", agents.values())
        up = ScalingDecision.objects.filter(model_version=version, action="scale_up",
                                            current_replicas=1).get()
        assert up.desired_replicas == 2
        assert set(up.readings["needs"]) & {"outstanding_tokens", "queue_depth"}, up.readings
        new = live().exclude(pk=warm.pk).get()
        assert new.zone == "zone-b" and new.node.name == f"{run}-b1"
        control.until(lambda: ready().count() == 2, 300, "the new replica ready", agents.values())
        new.refresh_from_db()
        new_answered = _successes(new)
        redis = control.redis
        control.until(lambda: redis.hexists(f"{settings.REDIS_KEY_PREFIX}outstanding:{version.pk}",
                                            str(new.pk)) and _successes(new) > new_answered,
                      120, "requests served by the new replica", agents.values())
        load.stop.set()
        for thread in threads:
            thread.join(120)
        assert load.served() >= 3 and all(ok for *_, ok in load.outcomes), load.outcomes

        # Down: idle, it goes back to min 1 once the cool-downs allow; one replica drains.
        idle_since = timezone.now()
        control.until(lambda: live().count() == 1, 60, "a scale down when idle", agents.values())
        down = ScalingDecision.objects.filter(model_version=version, action="scale_down").get()
        assert (down.current_replicas, down.desired_replicas) == (2, 1)
        last_up = ScalingDecision.objects.filter(model_version=version, action="scale_up").first()
        assert (down.at - last_up.at).total_seconds() >= DOWN_COOLDOWN_S
        window = ScalingDecision.objects.filter(
            model_version=version, at__gte=down.at - timedelta(seconds=DOWN_COOLDOWN_S), at__lt=down.at)
        assert all(d.recommended_replicas < 2 for d in window)
        drained = replicas.get(state__in=("draining", "stopped"))
        control.until(lambda: replicas.filter(pk=drained.pk, state="stopped").exists(), 60,
                      "the drained replica stopped", agents.values())
        assert [t.to_state for t in ReplicaTransition.objects.filter(replica=drained)][-2:] == [
            "draining", "stopped"]
        # No flapping: keep ticking idle; the desired count never goes back up.
        quiet_since = time.monotonic()
        control.until(lambda: time.monotonic() - quiet_since > DOWN_COOLDOWN_S, 30, "idle ticks")
        desired = [d.desired_replicas for d in _decisions(version, idle_since)]
        assert desired == sorted(desired, reverse=True) and desired[-1] == 1, desired
        assert not ScalingDecision.objects.filter(model_version=version, action="scale_up",
                                                  at__gte=idle_since).exists()
        assert ready().count() == 1 and live().count() == 1
    finally:
        load.stop.set()
        stop_fleet(agents, layout, control)
