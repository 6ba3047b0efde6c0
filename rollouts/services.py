"""Writes on rollouts: start, pause, resume, advance, promote, roll back.

Each locks the rollout row (SELECT ... FOR UPDATE), checks the state it expects, changes it
and records one RolloutStep, in one transaction, so the evaluator and a person acting at the
same moment cannot both act (the second sees the new state and gets RolloutError).

Version states: while a rollout is live its canary is `staging` (`serving_version` answers
stable; the rollout's split sends the canary its share). Promotion makes the canary `active`
and retires stable: the newest active version serves everything and stable can be brought
back only by a new rollout. Rollback retires the canary.

Replicas (a rollout owns its versions' fleet): when stable is scaled by the fleet (an enabled
ScalingPolicy), starting a rollout gives the canary a policy too (stable's, at least one
replica), so the autoscaler places its replicas; until one of them is ready the rollout runs at
0% (`waiting for the canary's replicas`) and the evaluator opens the first step once one is
(`open_canary`). Promotion gives the canary stable's policy; whichever version is retired has
its policy disabled, and the fleet drains and stops a retired version's replicas
(fleet.autoscaler.retire_replicas).
"""
from __future__ import annotations

from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from billing.selectors import MissingPrice, require_price
from models_registry.models import ModelVersion, Replica, ScalingPolicy
from rollouts.models import Rollout, RolloutStep

EVALUATOR = "evaluator"  # the actor name of automatic steps
THRESHOLD_FIELDS = ("window_s", "step_min_s", "min_requests", "max_error_rate_delta",
                    "max_latency_ratio", "latency_slack_ms", "min_agreement", "probe_max_tokens")


class RolloutError(ValueError):
    """A rollout action that does not apply (wrong state, bad steps, ...): a client error."""


def _now(now: datetime | None) -> datetime:
    return now if now is not None else timezone.now()


def _validate_steps(steps: list) -> list[int | float]:
    if (not isinstance(steps, list) or not steps
            or not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in steps)):
        raise RolloutError("steps must be a non-empty list of percentages, e.g. [5, 25, 50, 100]")
    if any(b <= a for a, b in zip(steps, steps[1:])) or steps[0] <= 0 or steps[-1] != 100:
        raise RolloutError("steps must increase strictly from above 0 and end at 100")
    return steps


def _record(rollout: Rollout, kind: str, from_percent: float, *, actor: str, reason: str,
            evidence: dict | None, now: datetime) -> RolloutStep:
    return RolloutStep.objects.create(
        rollout=rollout, kind=kind, from_percent=from_percent, to_percent=rollout.traffic_percent,
        automatic=actor == EVALUATOR, actor=actor, reason=reason, evidence=evidence or {},
        occurred_at=now)


def start_rollout(canary: ModelVersion, *, stable: ModelVersion | None = None,
                  steps: list | None = None, actor: str = "", now: datetime | None = None,
                  **thresholds) -> Rollout:
    """Start sending `steps[0]`% of the model's traffic to `canary`. `stable` defaults to the
    version serving now (the newest active one). Raises RolloutError, also when the canary has
    no price in effect (its traffic would be free)."""
    now = _now(now)
    unknown = set(thresholds) - set(THRESHOLD_FIELDS)
    if unknown:
        raise RolloutError(f"unknown thresholds: {', '.join(sorted(unknown))}")
    steps = _validate_steps(steps if steps is not None else [5, 25, 50, 100])
    if steps[0] >= 100:
        raise RolloutError("the first step must be below 100%: start a rollout, not a switch")
    with transaction.atomic():
        if stable is None:
            stable = (ModelVersion.objects.select_for_update()
                      .filter(model=canary.model, state=ModelVersion.State.ACTIVE)
                      .exclude(pk=canary.pk).order_by("-version_number").first())
            if stable is None:
                raise RolloutError(f"{canary.model.name} has no other active version to compare with")
        if stable.model_id != canary.model_id:
            raise RolloutError("stable and canary must be versions of the same model")
        if stable.pk == canary.pk:
            raise RolloutError("the canary must be another version than stable")
        if stable.state != ModelVersion.State.ACTIVE:
            raise RolloutError(f"the stable version {stable} is not active")
        try:
            require_price(canary, now)
        except MissingPrice as exc:
            raise RolloutError(str(exc)) from None
        try:
            with transaction.atomic():
                rollout = Rollout.objects.create(
                    model_id=canary.model_id, stable_version=stable, canary_version=canary,
                    steps=steps, step_index=0, traffic_percent=float(steps[0]),
                    step_started_at=now, created_by=actor, **thresholds)
        except IntegrityError:
            raise RolloutError(f"{canary.model.name} already has a live rollout") from None
        # Staging: never the newest active version while it is on trial.
        ModelVersion.objects.filter(pk=canary.pk).update(state=ModelVersion.State.STAGING)
        reason = f"canary {canary} at {steps[0]:g}% against {stable}"
        if _canary_replicas(canary, stable) and not canary_ready(rollout):
            rollout.traffic_percent = 0.0  # its share starts once a replica is ready
            rollout.save(update_fields=["traffic_percent"])
            reason += "; 0% while waiting for the canary's replicas"
        _record(rollout, RolloutStep.Kind.START, 0.0, actor=actor, reason=reason, evidence=None,
                now=now)
    return rollout


_POLICY_FIELDS = [f.name for f in ScalingPolicy._meta.concrete_fields
                  if f.name not in ("id", "model_version")]


def _copy_policy(source: ScalingPolicy, target: ModelVersion, **overrides) -> ScalingPolicy:
    values = {name: getattr(source, name) for name in _POLICY_FIELDS}
    policy, _ = ScalingPolicy.objects.update_or_create(model_version=target,
                                                       defaults={**values, **overrides})
    return policy


def _canary_replicas(canary: ModelVersion, stable: ModelVersion) -> bool:
    """Give the canary a fleet when stable has one; True when the canary's replicas are the
    fleet's to place (the rollout then waits for one to be ready)."""
    source = ScalingPolicy.objects.filter(model_version=stable, enabled=True).first()
    own = ScalingPolicy.objects.filter(model_version=canary).first()
    if own is not None:
        if own.enabled and own.min_replicas == 0:
            ScalingPolicy.objects.filter(pk=own.pk).update(min_replicas=1)
        return own.enabled
    if source is None:
        return False  # replicas registered by hand: the operator starts them
    _copy_policy(source, canary, enabled=True, min_replicas=1,
                 scale_to_zero=False)
    return True


def canary_ready(rollout: Rollout) -> bool:
    return Replica.objects.filter(model_version_id=rollout.canary_version_id,
                                  state=Replica.State.READY).exists()


def _retire_policy(version_id: int) -> None:
    """No scaling for a retired version: the fleet drains its replicas."""
    ScalingPolicy.objects.filter(model_version_id=version_id).update(enabled=False)


def open_canary(rollout: Rollout, *, now: datetime | None = None) -> Rollout:
    """The canary's replicas are ready: start its first step (the evaluator calls this)."""
    now = _now(now)
    with transaction.atomic():
        locked = _locked(rollout.pk, (Rollout.State.RUNNING,), "open")
        if locked.traffic_percent > 0 or locked.step_index != 0:
            raise RolloutError("the canary already gets traffic")
        locked.traffic_percent = float(locked.steps[0])
        locked.step_started_at = now
        locked.save(update_fields=["traffic_percent", "step_started_at"])
        _record(locked, RolloutStep.Kind.ADVANCE, 0.0, actor=EVALUATOR,
                reason=f"the canary's replicas are ready: {locked.steps[0]:g}%", evidence=None,
                now=now)
    return locked


def _locked(rollout_id: int, states: tuple[str, ...], action: str) -> Rollout:
    rollout = Rollout.objects.select_for_update().get(pk=rollout_id)
    if rollout.state not in states:
        raise RolloutError(f"cannot {action} a rollout that is {rollout.state}")
    return rollout


def pause_rollout(rollout: Rollout, *, actor: str = "", reason: str = "",
                  now: datetime | None = None) -> Rollout:
    """Freeze the share: the evaluator stops acting until resumed."""
    now = _now(now)
    with transaction.atomic():
        locked = _locked(rollout.pk, (Rollout.State.RUNNING,), "pause")
        locked.state = Rollout.State.PAUSED
        locked.save(update_fields=["state"])
        _record(locked, RolloutStep.Kind.PAUSE, locked.traffic_percent, actor=actor,
                reason=reason or "paused", evidence=locked.last_evidence, now=now)
    return locked


def resume_rollout(rollout: Rollout, *, actor: str = "", reason: str = "",
                   now: datetime | None = None) -> Rollout:
    """Hand the rollout back to the evaluator; the current step starts afresh (its evidence
    window and minimum time restart from now)."""
    now = _now(now)
    with transaction.atomic():
        locked = _locked(rollout.pk, (Rollout.State.PAUSED,), "resume")
        locked.state = Rollout.State.RUNNING
        locked.step_started_at = now
        locked.save(update_fields=["state", "step_started_at"])
        _record(locked, RolloutStep.Kind.RESUME, locked.traffic_percent, actor=actor,
                reason=reason or "resumed", evidence=None, now=now)
    return locked


def advance_rollout(rollout: Rollout, *, expected_step_index: int, actor: str = EVALUATOR,
                    reason: str = "", evidence: dict | None = None,
                    now: datetime | None = None) -> Rollout:
    """Move to the next step; the last step (100%) is promotion. `expected_step_index` guards
    against two evaluators advancing the same step twice."""
    now = _now(now)
    with transaction.atomic():
        locked = _locked(rollout.pk, (Rollout.State.RUNNING,), "advance")
        if locked.step_index != expected_step_index:
            raise RolloutError(f"the rollout moved to step {locked.step_index} meanwhile")
        if locked.step_index + 1 >= len(locked.steps) or locked.steps[locked.step_index + 1] >= 100:
            return _promote(locked, actor=actor, reason=reason, evidence=evidence, now=now)
        previous = locked.traffic_percent
        locked.step_index += 1
        locked.traffic_percent = float(locked.steps[locked.step_index])
        locked.step_started_at = now
        locked.save(update_fields=["step_index", "traffic_percent", "step_started_at"])
        _record(locked, RolloutStep.Kind.ADVANCE, previous, actor=actor, reason=reason,
                evidence=evidence, now=now)
    return locked


def _promote(locked: Rollout, *, actor: str, reason: str, evidence: dict | None,
             now: datetime) -> Rollout:
    previous = locked.traffic_percent
    ModelVersion.objects.filter(pk=locked.canary_version_id).update(state=ModelVersion.State.ACTIVE)
    ModelVersion.objects.filter(pk=locked.stable_version_id).update(state=ModelVersion.State.RETIRED)
    stable_policy = ScalingPolicy.objects.filter(model_version_id=locked.stable_version_id,
                                                 enabled=True).first()
    if stable_policy is not None:  # the canary now takes all the traffic: stable's fleet size
        _copy_policy(stable_policy, locked.canary_version)
    _retire_policy(locked.stable_version_id)
    locked.state = Rollout.State.PROMOTED
    locked.traffic_percent = 100.0
    locked.step_index = len(locked.steps) - 1
    locked.finished_at = now
    locked.save(update_fields=["state", "traffic_percent", "step_index", "finished_at"])
    _record(locked, RolloutStep.Kind.PROMOTE, previous, actor=actor, reason=reason,
            evidence=evidence, now=now)
    return locked


def promote_rollout(rollout: Rollout, *, actor: str = "", reason: str = "",
                    evidence: dict | None = None, now: datetime | None = None) -> Rollout:
    """Make the canary the serving version now, whatever step it is at."""
    now = _now(now)
    with transaction.atomic():
        locked = _locked(rollout.pk, Rollout.LIVE_STATES, "promote")
        return _promote(locked, actor=actor, reason=reason or "promoted by hand",
                        evidence=evidence if evidence is not None else locked.last_evidence,
                        now=now)


def rollback_rollout(rollout: Rollout, *, actor: str = "", reason: str = "",
                     evidence: dict | None = None, now: datetime | None = None) -> Rollout:
    """Send everything back to stable and retire the canary. The evaluator acts only on a
    running rollout; a person may also roll back a paused one."""
    now = _now(now)
    states = (Rollout.State.RUNNING,) if actor == EVALUATOR else Rollout.LIVE_STATES
    with transaction.atomic():
        locked = _locked(rollout.pk, states, "roll back")
        previous = locked.traffic_percent
        ModelVersion.objects.filter(pk=locked.canary_version_id).update(
            state=ModelVersion.State.RETIRED)
        _retire_policy(locked.canary_version_id)
        locked.state = Rollout.State.ROLLED_BACK
        locked.traffic_percent = 0.0
        locked.finished_at = now
        locked.save(update_fields=["state", "traffic_percent", "finished_at"])
        _record(locked, RolloutStep.Kind.ROLLBACK, previous, actor=actor,
                reason=reason or "rolled back by hand",
                evidence=evidence if evidence is not None else locked.last_evidence, now=now)
    return locked
