"""Placement, lifecycle, lost nodes and the autoscaler's tick on the real PostgreSQL and Redis,
with an injected clock and a dispatcher that records what it would send to node agents."""
from datetime import datetime, timedelta, timezone

import pytest
import redis as redis_lib
from django.conf import settings

from inference.admission import queue_keys
from fleet.autoscaler import FleetContext, autoscale_version
from tests.fakes.dispatcher import RecordingDispatcher
from fleet.lifecycle import IllegalTransition, history, transition
from fleet.models import RateSample, ReplicaTransition, ScalingDecision
from models_registry.models import Replica, ScalingPolicy
from fleet.nodes import detect_lost_nodes, heartbeat, register_node
from fleet.placement import drain_replicas, place_replicas
from models_registry.services import ensure_model_version
from tests.support.billing import priced

pytestmark = pytest.mark.django_db(transaction=True)
T0 = datetime(2026, 11, 2, 0, 0, tzinfo=timezone.utc)
LOST_AFTER = 15.0


@pytest.fixture
def version():
    return priced(ensure_model_version("chat-small", 1, "fake", tokenizer="bytes"))


@pytest.fixture
def nodes():
    """Three nodes in two zones, 2 slots each (a replica takes 1)."""
    return [register_node(name, zone=zone, address="127.0.0.1", cpu_slots=2, memory_mib=4096,
                          accelerator="cpu", now=T0)
            for name, zone in (("a1", "zone-a"), ("a2", "zone-a"), ("b1", "zone-b"))]


@pytest.fixture
def redis():
    client = redis_lib.Redis.from_url(settings.REDIS_URL)
    yield client
    client.close()


def place(version, n, dispatcher, now=T0, **kw):
    return place_replicas(version, n, now=now, reason="test", dispatcher=dispatcher,
                          lost_after_s=LOST_AFTER, **kw)


def test_placement_spreads_zones_respects_capacity_and_dispatches(version, nodes):
    dispatcher = RecordingDispatcher()
    placed = place(version, 4, dispatcher)
    zones = [r.zone for r in placed]
    assert zones.count("zone-a") == 2 and zones.count("zone-b") == 2
    assert all(r.state == "loading" and r.managed and r.grpc_address == "" for r in placed)
    assert [(kind, queue) for kind, queue, _ in dispatcher.sent] == [
        ("start", f"node.{r.node.name}") for r in placed]
    # 6 slots in all: two more fit, then the fleet is full.
    assert len(place(version, 5, dispatcher)) == 2
    assert Replica.objects.filter(state="loading").count() == 6
    assert history(placed[0].pk)[0][1] == "loading"


def test_placement_skips_silent_unschedulable_and_full_nodes(version, nodes):
    heartbeat("a1", T0 + timedelta(seconds=30))
    heartbeat("b1", T0 + timedelta(seconds=30))  # a2 silent for 30 s
    nodes[2].is_schedulable = False
    nodes[2].save()
    placed = place(version, 3, RecordingDispatcher(), now=T0 + timedelta(seconds=30))
    assert {r.node.name for r in placed} == {"a1"} and len(placed) == 2


def test_lifecycle_records_every_transition_and_refuses_illegal_ones(version, nodes):
    replica = place(version, 1, RecordingDispatcher())[0]
    now = T0 + timedelta(seconds=5)
    assert transition(replica.pk, "ready", "warm-up answered", now)
    assert not transition(replica.pk, "ready", "again", now)  # already there
    with pytest.raises(IllegalTransition):
        transition(replica.pk, "loading", "back", now)
    assert transition(replica.pk, "draining", "scale down", now)
    assert transition(replica.pk, "stopped", "drained", now)
    with pytest.raises(IllegalTransition):
        transition(replica.pk, "ready", "revive", now)
    assert [(f, t) for f, t, _ in history(replica.pk)] == [
        ("", "loading"), ("loading", "ready"), ("ready", "draining"), ("draining", "stopped")]
    assert ReplicaTransition.objects.filter(replica=replica, reason="drained", at=now).exists()


def test_drain_prefers_loading_then_least_loaded_from_the_fullest_zone(version, nodes):
    dispatcher = RecordingDispatcher()
    r1, r2, r3 = place(version, 3, dispatcher)
    for r in (r1, r2, r3):
        transition(r.pk, "ready", "test", T0)
    extra = place(version, 1, dispatcher)[0]  # loading
    drained = drain_replicas(version, 2, now=T0, reason="idle", dispatcher=dispatcher,
                             outstanding={r1.pk: 50, r2.pk: 0, r3.pk: 500})
    assert drained[0].pk == extra.pk
    assert drained[1].state in ("loading", "ready")
    assert Replica.objects.get(pk=drained[1].pk).state == "draining"
    assert ("stop", f"node.{drained[0].node.name}", drained[0].pk) in dispatcher.sent


def test_lost_node_replicas_fail_and_are_replaced_in_another_zone(version, nodes):
    ScalingPolicy.objects.create(model_version=version, min_replicas=2)
    dispatcher = RecordingDispatcher()
    placed = place(version, 2, dispatcher)
    for r in placed:
        transition(r.pk, "ready", "test", T0)
    lost = next(r for r in placed if r.zone == "zone-a")
    later = T0 + timedelta(seconds=LOST_AFTER + 5)
    for node in nodes:
        if node.pk != lost.node_id:
            heartbeat(node.name, later)
    replaced = detect_lost_nodes(later, lost_after_s=LOST_AFTER, dispatcher=dispatcher)
    assert list(replaced) == [lost.node.name] and len(replaced[lost.node.name]) == 1
    replacement = Replica.objects.get(pk=replaced[lost.node.name][0])
    assert replacement.zone == "zone-b" and replacement.state == "loading"
    failed = Replica.objects.get(pk=lost.pk)
    assert failed.state == "failed"
    assert "lost" in history(lost.pk)[-1][2]
    assert not heartbeat(lost.node.name, later)  # the agent must register again
    # Its agent comes back: schedulable again; nothing it had is revived.
    register_node(lost.node.name, zone="zone-a", address="127.0.0.1", cpu_slots=2,
                  memory_mib=4096, accelerator="cpu", now=later)
    assert Replica.objects.get(pk=lost.pk).state == "failed"
    assert detect_lost_nodes(later, lost_after_s=LOST_AFTER, dispatcher=dispatcher) == {}


def _ctx(redis, dispatcher):
    return FleetContext(redis=redis, key_prefix=settings.REDIS_KEY_PREFIX + "fleet-test:",
                        dispatcher=dispatcher, tick_s=5.0, lost_after_s=1e9)


def test_autoscale_tick_scales_on_queue_depth_and_stores_why(version, nodes, redis):
    policy = ScalingPolicy.objects.create(model_version=version, min_replicas=1, max_replicas=4,
                                          target_queue_depth=2, scale_up_cooldown_s=10)
    dispatcher = RecordingDispatcher()
    ctx = _ctx(redis, dispatcher)
    first = autoscale_version(policy.pk, T0, ctx)
    assert first.action == "scale_up" and first.desired_replicas == 1  # the min
    replica = Replica.objects.get(model_version=version)
    transition(replica.pk, "ready", "test", T0)
    waiting = queue_keys(ctx.key_prefix, version.model.name)[0]  # the model's queue
    # Tickets are tenant:version:uuid; one waiter of another version does not count.
    redis.hset(waiting, mapping={f"t{i}:{version.pk}:{i}": "{}" for i in range(5)})
    redis.hset(waiting, f"t9:{version.pk + 1000}:9", "{}")
    second = autoscale_version(policy.pk, T0 + timedelta(seconds=30), ctx)
    assert second.action == "scale_up" and second.desired_replicas == 1 + 3
    assert second.readings["queue_depth"] == 5 and second.readings["needs"]["queue_depth"] == 4
    assert Replica.objects.filter(model_version=version, state="loading").count() == 3
    assert len(dispatcher.sent) == 4
    redis.delete(waiting)


def test_autoscale_records_rates_and_the_forecast_starts_replicas_ahead(version, nodes, redis):
    """Yesterday's samples hold a peak at 12:00; today at 11:55 (load time 10 min) the tick
    already asks for the peak's replicas although nothing is queued."""
    policy = ScalingPolicy.objects.create(
        model_version=version, min_replicas=1, max_replicas=6, replica_capacity_rps=2.0,
        default_load_seconds=600, forecast_bin_s=300, scale_up_cooldown_s=0)
    yesterday_noon = T0 + timedelta(hours=12)
    RateSample.objects.bulk_create([
        RateSample(model_version=version, at=yesterday_noon + timedelta(minutes=m), window_s=60,
                   num_requests=600 if m < 60 else 30) for m in range(1, 120)])
    dispatcher = RecordingDispatcher()
    ctx = _ctx(redis, dispatcher)
    today = T0 + timedelta(days=1, hours=11, minutes=55)
    first = autoscale_version(policy.pk, today - timedelta(seconds=5), ctx)
    assert first.readings["forecast_rps"] == 10.0 and first.readings["needs"]["forecast"] == 5
    assert first.readings["queue_depth"] == 0 and first.readings["request_rate_rps"] == 0.0
    assert first.action == "scale_up" and first.desired_replicas == 5
    assert Replica.objects.filter(model_version=version, state="loading").count() == 5
    stats = queue_keys(ctx.key_prefix, version.model.name)[3]
    redis.hincrby(stats, f"seq:{version.pk}", 10)  # 10 requests arrived in the 5 s since
    redis.hincrby(stats, f"seq:{version.pk + 1000}", 7)  # another version's: not counted
    second = autoscale_version(policy.pk, today, ctx)
    assert second.action == "hold" and second.readings["request_rate_rps"] == 2.0
    sample = RateSample.objects.filter(model_version=version).latest("at")
    assert sample.num_requests == 10 and sample.window_s == 5.0
    assert ScalingDecision.objects.filter(model_version=version).count() == 2


def test_autoscaler_holds_an_unpriced_version_and_says_why(nodes, redis):
    unpriced = ensure_model_version("unpriced", 1, "fake", tokenizer="bytes")
    policy = ScalingPolicy.objects.create(model_version=unpriced, min_replicas=1, max_replicas=2)
    dispatcher = RecordingDispatcher()
    decision = autoscale_version(policy.pk, T0, _ctx(redis, dispatcher))
    assert decision.action == "hold" and "no price in effect" in decision.reason
    assert not Replica.objects.filter(model_version=unpriced).exists()
    assert dispatcher.sent == []
