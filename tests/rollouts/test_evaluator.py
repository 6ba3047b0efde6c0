"""The evaluator against real PostgreSQL (usage rows) and Redis (fallback counts), with an
injected clock and a scripted probe (the real probe runs in tests/e2e/test_canary_rollout.py)."""
from django.conf import settings

from models_registry.models import ModelVersion
from rollouts.models import Rollout, RolloutStep
from rollouts import services
from rollouts.decision import ProbeResult
from rollouts.evaluator import RolloutEvaluator
from inference.fallbacks import FAILED, UNAVAILABLE
from tests.rollouts.conftest import add_fallbacks

AGREES = ProbeResult(agreement=1.0, exact_match=1.0, num_prompts=5)
DISAGREES = ProbeResult(agreement=0.05, exact_match=0.0, num_prompts=5,
                        samples=[{"prompt": "p", "stable": "Paris", "canary": "zzzz", "agreement": 0}])


class ScriptedProbe:
    def __init__(self, result: ProbeResult):
        self.result = result
        self.calls = 0

    def __call__(self, rollout):
        self.calls += 1
        return self.result


def make(clock, sync_redis, probe) -> RolloutEvaluator:
    return RolloutEvaluator(clock=clock, redis=sync_redis, key_prefix=settings.REDIS_KEY_PREFIX,
                            probe=probe)


def start(versions, clock, **kw) -> Rollout:
    kw = {"min_requests": 10, "step_min_s": 60, "window_s": 600, **kw}
    return services.start_rollout(versions[1], steps=[10, 50, 100], now=clock(), **kw)


def fresh(rollout) -> Rollout:
    return Rollout.objects.get(pk=rollout.pk)


def test_healthy_canary_advances_step_by_step_then_is_promoted(versions, clock, sync_redis, usage):
    stable, canary = versions
    rollout = start(versions, clock)
    probe = ScriptedProbe(AGREES)
    evaluator = make(clock, sync_redis, probe)

    assert evaluator.evaluate(fresh(rollout)) == "hold"  # no traffic, step too young
    assert probe.calls == 1  # probed at the first evaluation of the step
    clock.advance(30)
    usage(stable, 30, at=clock())
    usage(canary, 10, at=clock())
    assert evaluator.evaluate(fresh(rollout)) == "hold"  # 30 s < step_min_s
    assert probe.calls == 1  # once per step
    clock.advance(40)
    assert evaluator.evaluate(fresh(rollout)) == "advance"
    r = fresh(rollout)
    assert (r.state, r.step_index, r.traffic_percent) == ("running", 1, 50.0)
    step = r.history.get(kind=RolloutStep.Kind.ADVANCE)
    assert (step.from_percent, step.to_percent, step.automatic) == (10.0, 50.0, True)
    assert step.evidence["canary"]["num_requests"] == 10
    assert step.evidence["stable"]["num_requests"] == 30
    assert step.evidence["canary"]["ttft_p90_ms"] == 100.0
    assert step.evidence["canary"]["tpot_p90_ms"] == 20.0
    assert step.evidence["probe"]["agreement"] == 1.0

    # The new step starts empty: the rows of the previous step do not count.
    clock.advance(61)
    assert evaluator.evaluate(fresh(rollout)) == "hold"
    assert probe.calls == 2
    usage(stable, 10, at=clock())
    usage(canary, 10, at=clock())
    clock.advance(1)
    assert evaluator.evaluate(fresh(rollout)) == "promote"
    r = fresh(rollout)
    assert (r.state, r.traffic_percent) == ("promoted", 100.0)
    assert ModelVersion.objects.get(pk=canary.pk).state == "active"
    assert ModelVersion.objects.get(pk=stable.pk).state == "retired"
    assert list(r.history.values_list("kind", flat=True)) == ["start", "advance", "promote"]


def test_failing_canary_rolls_back(versions, clock, sync_redis, usage):
    stable, canary = versions
    rollout = start(versions, clock)
    clock.advance(5)
    usage(stable, 20, at=clock())
    usage(canary, 6, at=clock())
    usage(canary, 4, at=clock(), status="failed")
    assert make(clock, sync_redis, ScriptedProbe(AGREES)).evaluate(fresh(rollout)) == "rollback"
    r = fresh(rollout)
    assert (r.state, r.traffic_percent) == ("rolled_back", 0.0)
    assert ModelVersion.objects.get(pk=canary.pk).state == "retired"
    assert ModelVersion.objects.get(pk=stable.pk).state == "active"
    step = r.history.get(kind=RolloutStep.Kind.ROLLBACK)
    assert "error rate 0.400" in step.reason and step.evidence["canary"]["num_failed"] == 4


def test_canary_failures_that_stable_served_roll_back(versions, clock, sync_redis, usage):
    stable, _ = versions
    rollout = start(versions, clock)
    clock.advance(5)
    usage(stable, 20, at=clock())
    add_fallbacks(sync_redis, rollout.pk, FAILED, clock(), 12)
    add_fallbacks(sync_redis, rollout.pk, UNAVAILABLE, clock(), 3)
    assert make(clock, sync_redis, ScriptedProbe(AGREES)).evaluate(fresh(rollout)) == "rollback"
    step = fresh(rollout).history.get(kind=RolloutStep.Kind.ROLLBACK)
    assert step.evidence["canary"]["num_fallbacks_failed"] == 12
    assert step.evidence["canary"]["num_fallbacks_unavailable"] == 3
    assert "12 of 12 attempts failed" in step.reason


def test_probe_disagreement_rolls_back_at_once(versions, clock, sync_redis):
    rollout = start(versions, clock)
    assert make(clock, sync_redis, ScriptedProbe(DISAGREES)).evaluate(fresh(rollout)) == "rollback"
    step = fresh(rollout).history.get(kind=RolloutStep.Kind.ROLLBACK)
    assert step.evidence["probe"]["samples"][0]["canary"] == "zzzz"


def test_slow_canary_rolls_back(versions, clock, sync_redis, usage):
    stable, canary = versions
    rollout = start(versions, clock)
    clock.advance(5)
    usage(stable, 20, at=clock(), ttft_ms=100.0)
    usage(canary, 20, at=clock(), ttft_ms=400.0)
    assert make(clock, sync_redis, ScriptedProbe(AGREES)).evaluate(fresh(rollout)) == "rollback"
    assert "TTFT" in fresh(rollout).history.get(kind=RolloutStep.Kind.ROLLBACK).reason


def test_window_excludes_old_rows(versions, clock, sync_redis, usage):
    stable, canary = versions
    rollout = start(versions, clock, window_s=60, step_min_s=0)
    usage(canary, 20, at=clock(), status="failed")  # old failures, outside the window later
    clock.advance(120)
    usage(stable, 10, at=clock())
    usage(canary, 10, at=clock())
    clock.advance(1)
    assert make(clock, sync_redis, ScriptedProbe(AGREES)).evaluate(fresh(rollout)) == "advance"


def test_probe_that_cannot_run_is_retried_and_holds(versions, clock, sync_redis):
    rollout = start(versions, clock)
    probe = ScriptedProbe(ProbeResult(0.0, 0.0, 0, error="no ready canary replica"))
    evaluator = make(clock, sync_redis, probe)
    assert evaluator.evaluate(fresh(rollout)) == "hold"
    assert evaluator.evaluate(fresh(rollout)) == "hold"
    assert probe.calls == 2
    assert "could not run" in " ".join(fresh(rollout).last_evidence["reasons"])


def test_paused_rollout_is_observed_not_changed(versions, clock, sync_redis, usage):
    _, canary = versions
    rollout = start(versions, clock)
    services.pause_rollout(rollout, actor="am", now=clock())
    clock.advance(5)
    usage(canary, 20, at=clock(), status="failed")
    probe = ScriptedProbe(DISAGREES)
    assert make(clock, sync_redis, probe).evaluate_all() == {rollout.pk: "paused"}
    r = fresh(rollout)
    assert r.state == "paused" and probe.calls == 0
    assert r.last_evidence["canary"]["num_failed"] == 20 and r.last_evidence["decision"] == "hold"


def test_evaluator_acting_after_a_person_does_nothing(versions, clock, sync_redis, usage):
    _, canary = versions
    rollout = start(versions, clock)
    stale = fresh(rollout)  # what the evaluator loaded
    services.pause_rollout(rollout, actor="am", now=clock())
    clock.advance(5)
    usage(canary, 20, at=clock(), status="failed")
    assert make(clock, sync_redis, ScriptedProbe(AGREES)).evaluate(stale) == "superseded"
    assert fresh(rollout).state == "paused"


def test_the_beat_task_runs_the_real_probe_wiring(versions, clock):
    from rollouts.tasks import evaluate_rollouts

    rollout = start(versions, clock)
    # No replica is registered: the probe cannot run, the rollout holds.
    assert evaluate_rollouts.apply().get() == {rollout.pk: "hold"}
    assert "no ready stable replica" in fresh(rollout).probe_result["error"]
