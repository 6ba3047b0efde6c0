"""The autoscaler's tick for one model version: observe, decide, record, act.

Run by Celery beat (fleet.tasks.autoscale) every AUTOSCALER_INTERVAL_SECONDS for each
version with an enabled ScalingPolicy (retired versions' replicas are drained instead:
`retire_replicas`). The decision is `autoscaler.decide` (pure); this stores
it with the numbers that caused it (ScalingDecision), records the arrival rate (RateSample, the
forecast's history) and places or drains replicas. Two ticks for one version never overlap: the
policy row is locked (skip_locked: a tick that finds it locked does nothing).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction

from fleet import load_readings
from fleet.scaling_decision import Decision, PolicyView, decide
from fleet.dispatch import Dispatcher
from billing.selectors import MissingPrice
from fleet.models import RateSample, ScalingDecision
from models_registry.models import ModelVersion, Replica, ScalingPolicy
from fleet.placement import drain_replicas, place_replicas

DECISION_RETENTION = timedelta(days=2)


@dataclass(frozen=True)
class FleetContext:
    redis: object  # synchronous Redis client
    key_prefix: str
    dispatcher: Dispatcher
    tick_s: float
    lost_after_s: float


def autoscale_version(policy_id: int, now: datetime, ctx: FleetContext) -> ScalingDecision | None:
    with transaction.atomic():
        policy = (ScalingPolicy.objects.select_for_update(skip_locked=True)
                  .select_related("model_version").filter(pk=policy_id, enabled=True).first())
        if policy is None:
            return None
        arrivals = load_readings.count_arrivals(ctx.redis, ctx.key_prefix, policy.model_version_id,
                                                now.timestamp())
        if arrivals[1] > 0:
            RateSample.objects.create(model_version_id=policy.model_version_id, at=now,
                                      window_s=arrivals[1], num_requests=arrivals[0])
        readings, outstanding = load_readings.read(policy, now, ctx.redis, ctx.key_prefix,
                                                   ctx.tick_s, arrivals)
        decision = decide(PolicyView.from_policy(policy), readings, now.timestamp(),
                          load_readings.history(policy, now))
        decision = _act(policy, decision, now, ctx, outstanding)
        row = ScalingDecision.objects.create(
            model_version_id=policy.model_version_id, at=now, action=decision.action,
            current_replicas=decision.current, recommended_replicas=decision.recommended,
            desired_replicas=decision.desired, reason=decision.reason[:300],
            readings=decision.numbers)
        ScalingDecision.objects.filter(model_version_id=policy.model_version_id,
                                       action=ScalingDecision.Action.HOLD,
                                       at__lt=now - DECISION_RETENTION).delete()
        RateSample.objects.filter(model_version_id=policy.model_version_id, at__lt=now - timedelta(
            seconds=policy.forecast_period_s * (load_readings.FORECAST_PERIODS + 1))).delete()
    return row


def _act(policy: ScalingPolicy, decision: Decision, now: datetime, ctx: FleetContext,
         outstanding: dict[int, int]) -> Decision:
    version = policy.model_version
    if decision.delta > 0:
        try:
            placed = place_replicas(version, decision.delta, now=now, reason=decision.reason,
                                    dispatcher=ctx.dispatcher, lost_after_s=ctx.lost_after_s)
        except MissingPrice as exc:
            return Decision("hold", decision.current, decision.recommended, decision.current,
                            f"{decision.reason}; not placed: {exc}",
                            {**decision.numbers, "placed": 0})
        if len(placed) < decision.delta:
            return Decision(decision.action if placed else "hold", decision.current,
                            decision.recommended, decision.current + len(placed),
                            f"{decision.reason}; no node had room: placed {len(placed)} of "
                            f"{decision.delta}", {**decision.numbers, "placed": len(placed)})
    elif decision.delta < 0:
        drain_replicas(version, -decision.delta, now=now, reason=f"scale down: {decision.reason}",
                       dispatcher=ctx.dispatcher, outstanding=outstanding)
    return decision


def retire_replicas(now: datetime, ctx: FleetContext) -> int:
    """Drain (then stop, through their agents) the placed replicas of retired versions: a
    rollout's promotion or rollback retires one, and no accelerator should keep serving a
    version nobody routes to. Returns how many were drained."""
    drained = 0
    retired = ModelVersion.objects.filter(
        state=ModelVersion.State.RETIRED, replicas__managed=True,
        replicas__state__in=(Replica.State.LOADING, Replica.State.READY)).distinct()
    for version in retired:
        with transaction.atomic():
            drained += len(drain_replicas(version, version.replicas.count(), now=now,
                                          reason="version retired", dispatcher=ctx.dispatcher,
                                          outstanding={}))
    return drained


def autoscale_all(now: datetime, ctx: FleetContext) -> list[ScalingDecision]:
    retire_replicas(now, ctx)
    ids = list(ScalingPolicy.objects.filter(enabled=True).exclude(
        model_version__state=ModelVersion.State.RETIRED).values_list("pk", flat=True))
    return [d for d in (autoscale_version(pk, now, ctx) for pk in ids) if d is not None]
