"""Rollouts own their versions' replicas (rollouts/services.py, fleet.autoscaler.retire_replicas),
on the real PostgreSQL and Redis with an injected clock: the canary of a fleet-scaled model gets
replicas placed before it gets traffic; promotion or rollback drains and stops the retired
version's replicas. The fleet's tick (autoscale_all) is what Celery beat runs."""
import pytest
from django.conf import settings

from fleet.autoscaler import FleetContext, autoscale_all
from fleet.lifecycle import transition
from fleet.nodes import register_node
from models_registry.models import ModelVersion, Replica, ScalingPolicy
from rollouts import services
from rollouts.decision import ProbeResult
from rollouts.evaluator import RolloutEvaluator
from rollouts.models import Rollout
from tests.fakes.dispatcher import RecordingDispatcher
from tests.support.billing import priced

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fleet(versions, clock, sync_redis):
    """Stable scaled by the fleet (two replicas, ready) on two nodes with room for more."""
    stable, _ = versions
    priced(stable)
    for name, zone in (("n1", "zone-a"), ("n2", "zone-b")):
        register_node(name, zone=zone, address=f"10.0.0.{len(name)}", cpu_slots=4,
                      memory_mib=8192, accelerator="cpu", now=clock())
    ScalingPolicy.objects.create(model_version=stable, min_replicas=2, max_replicas=3,
                                 predictive=False, scale_up_cooldown_s=0)
    ctx = FleetContext(redis=sync_redis, key_prefix=settings.REDIS_KEY_PREFIX,
                       dispatcher=RecordingDispatcher(), tick_s=5.0, lost_after_s=15.0)
    autoscale_all(clock(), ctx)
    for replica in Replica.objects.filter(model_version=stable):
        transition(replica.pk, Replica.State.READY, "test: serving", clock())
    return ctx


def _ready_all(version, clock):
    for pk in Replica.objects.filter(model_version=version, state="loading").values_list("pk", flat=True):
        transition(pk, Replica.State.READY, "test: warm-up answered", clock())


def _evaluator(clock, sync_redis):
    return RolloutEvaluator(clock=clock, redis=sync_redis, key_prefix=settings.REDIS_KEY_PREFIX,
                            probe=lambda rollout: ProbeResult(agreement=1.0, exact_match=1.0,
                                                              num_prompts=5))


def test_the_canary_gets_replicas_before_it_gets_traffic(versions, clock, sync_redis, fleet):
    stable, canary = versions
    rollout = services.start_rollout(canary, now=clock())
    assert rollout.traffic_percent == 0.0
    assert "waiting for the canary's replicas" in rollout.history.get().reason
    policy = ScalingPolicy.objects.get(model_version=canary)
    assert policy.enabled and policy.min_replicas == 1 and policy.max_replicas == 3
    evaluator = _evaluator(clock, sync_redis)
    assert evaluator.evaluate(rollout) == "waiting"

    autoscale_all(clock(), fleet)  # the fleet places the canary's replica
    placed = Replica.objects.get(model_version=canary)
    assert placed.state == "loading" and ("start", f"node.{placed.node.name}", placed.pk) in fleet.dispatcher.sent
    clock.advance(5)
    assert evaluator.evaluate(Rollout.objects.get(pk=rollout.pk)) == "waiting"
    _ready_all(canary, clock)
    clock.advance(5)
    assert evaluator.evaluate(Rollout.objects.get(pk=rollout.pk)) == "open"
    rollout.refresh_from_db()
    assert rollout.traffic_percent == 5.0 and rollout.step_started_at == clock()
    assert rollout.history.last().reason == "the canary's replicas are ready: 5%"


def test_a_canary_never_ready_is_rolled_back_at_the_deadline(versions, clock, sync_redis,
                                                            fleet, settings):
    """Its replica placed but never ready (weights that cannot download, an engine that never
    warms up): the rollout waits until ROLLOUT_READY_TIMEOUT_SECONDS, then rolls back and the
    fleet drains what it placed."""
    settings.ROLLOUT_READY_TIMEOUT_SECONDS = 600
    stable, canary = versions
    rollout = services.start_rollout(canary, now=clock())
    autoscale_all(clock(), fleet)
    assert Replica.objects.get(model_version=canary).state == "loading"
    evaluator = _evaluator(clock, sync_redis)
    clock.advance(599)
    assert evaluator.evaluate(Rollout.objects.get(pk=rollout.pk)) == "waiting"
    clock.advance(1)
    assert evaluator.evaluate(Rollout.objects.get(pk=rollout.pk)) == "rollback"
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.ROLLED_BACK and rollout.traffic_percent == 0.0
    step = rollout.history.last()
    assert step.kind == "rollback" and "no replica of the canary was ready 600 s" in step.reason
    assert ModelVersion.objects.get(pk=canary.pk).state == ModelVersion.State.RETIRED
    assert not ScalingPolicy.objects.get(model_version=canary).enabled
    # Stable's traffic and fleet are untouched.
    assert ScalingPolicy.objects.get(model_version=stable).enabled
    assert Replica.objects.filter(model_version=stable, state="ready").count() == 2


def test_promotion_drains_and_stops_stable_and_gives_the_canary_its_fleet(versions, clock,
                                                                            sync_redis, fleet):
    stable, canary = versions
    rollout = services.start_rollout(canary, now=clock())
    autoscale_all(clock(), fleet)
    _ready_all(canary, clock)
    services.promote_rollout(rollout, actor="am", now=clock())
    assert not ScalingPolicy.objects.get(model_version=stable).enabled
    assert ScalingPolicy.objects.get(model_version=canary).min_replicas == 2  # stable's size
    fleet.dispatcher.sent.clear()
    clock.advance(5)
    autoscale_all(clock(), fleet)
    old = list(Replica.objects.filter(model_version=stable))
    assert [r.state for r in old] == ["draining", "draining"]
    assert sorted(pk for kind, _, pk in fleet.dispatcher.sent if kind == "stop") == sorted(r.pk for r in old)
    assert all(r.transitions.last().reason == "version retired" for r in old)
    # The canary scales to stable's minimum; nothing new for the retired version.
    assert Replica.objects.filter(model_version=canary, state__in=("loading", "ready")).count() == 2
    clock.advance(5)
    autoscale_all(clock(), fleet)
    assert Replica.objects.filter(model_version=stable, state__in=("loading", "ready")).count() == 0


def test_rollback_drains_the_canarys_replicas(versions, clock, sync_redis, fleet):
    stable, canary = versions
    rollout = services.start_rollout(canary, now=clock())
    autoscale_all(clock(), fleet)
    _ready_all(canary, clock)
    services.rollback_rollout(rollout, actor="am", now=clock())
    assert ModelVersion.objects.get(pk=canary.pk).state == "retired"
    assert not ScalingPolicy.objects.get(model_version=canary).enabled
    clock.advance(5)
    autoscale_all(clock(), fleet)
    assert list(Replica.objects.filter(model_version=canary).values_list("state", flat=True)) == ["draining"]
    assert Replica.objects.filter(model_version=stable, state="ready").count() == 2


def test_a_hand_registered_stable_leaves_the_canary_to_the_operator(versions, clock):
    rollout = services.start_rollout(versions[1], now=clock())
    assert rollout.traffic_percent == 5.0
    assert not ScalingPolicy.objects.filter(model_version=versions[1]).exists()
