"""The canary evaluator (Celery beat, `rollouts.tasks.evaluate_rollouts`).

For each running rollout: gather the evidence of its current step (usage rows of the last
`window_s` seconds, never before the step started; the canary's fallbacks; the quality probe,
run once per step, on the first evaluation of the step), decide (rollouts/decision.py) and
apply it through the services, which record the step with its evidence. Paused rollouts get
their evidence refreshed (for the console) but nothing is decided for them.

Collaborators are injected: the clock (aware datetimes), a synchronous Redis client and the
probe (`probe(rollout) -> ProbeResult`; the task wires in real replicas).
"""
from __future__ import annotations

import logging
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Callable

from django.conf import settings

from rollouts.models import Rollout
from rollouts import services
from rollouts.decision import (
    ADVANCE,
    HOLD,
    ROLLBACK,
    Decision,
    Evidence,
    ProbeResult,
    Thresholds,
    decide,
)
from rollouts.evidence import version_stats, with_fallbacks
from inference.fallbacks import count_fallbacks

logger = logging.getLogger(__name__)


def thresholds_of(rollout: Rollout) -> Thresholds:
    return Thresholds(
        min_requests=rollout.min_requests, step_min_s=float(rollout.step_min_s),
        max_error_rate_delta=rollout.max_error_rate_delta,
        max_latency_ratio=rollout.max_latency_ratio, latency_slack_ms=rollout.latency_slack_ms,
        min_agreement=rollout.min_agreement)


def _probe_from_json(data: dict) -> ProbeResult | None:
    if not data:
        return None
    return ProbeResult(**data)


class RolloutEvaluator:
    def __init__(self, *, clock: Callable[[], datetime], redis, key_prefix: str,
                 probe: Callable[[Rollout], ProbeResult]):
        self._clock = clock
        self._redis = redis
        self._prefix = key_prefix
        self._probe = probe

    def evaluate_all(self) -> dict[int, str]:
        """rollout id -> action taken (hold | advance | promote | rollback | paused | error |
        waiting | open: see `_open`)."""
        outcomes = {}
        for rollout in Rollout.objects.filter(state__in=Rollout.LIVE_STATES).order_by("pk"):
            try:
                outcomes[rollout.pk] = self.evaluate(rollout)
            except Exception:  # noqa: BLE001 - one broken rollout must not stop the others
                logger.exception("evaluating rollout %s failed", rollout.pk)
                outcomes[rollout.pk] = "error"
        return outcomes

    def evidence(self, rollout: Rollout, now: datetime, probe: ProbeResult | None) -> Evidence:
        since = max(rollout.step_started_at, now - timedelta(seconds=rollout.window_s))
        stats = version_stats(rollout.stable_version_id, rollout.canary_version_id, since, now)
        fallbacks = count_fallbacks(self._redis, self._prefix, rollout.pk, since.timestamp(),
                                    now.timestamp())
        return Evidence(
            canary=with_fallbacks(stats[rollout.canary_version_id], fallbacks),
            stable=stats[rollout.stable_version_id],
            probe=probe,
            step_age_s=(now - rollout.step_started_at).total_seconds())

    def evaluate(self, rollout: Rollout) -> str:
        now = self._clock()
        if (rollout.state == Rollout.State.RUNNING and rollout.traffic_percent == 0
                and rollout.step_index == 0):
            return self._open(rollout, now)
        probe = (_probe_from_json(rollout.probe_result)
                 if rollout.probe_step_index == rollout.step_index else None)
        if rollout.state == Rollout.State.RUNNING and probe is None:
            probe = self._probe(rollout)
            rollout.probe_result = asdict(probe)
            # A probe that could not run is tried again at the next evaluation.
            rollout.probe_step_index = rollout.step_index if probe.ran else -1
        evidence = self.evidence(rollout, now, probe)
        decision = (decide(evidence, thresholds_of(rollout))
                    if rollout.state == Rollout.State.RUNNING
                    else Decision(HOLD, ("paused",)))
        record = {**evidence.to_json(), "decision": decision.action,
                  "reasons": list(decision.reasons), "thresholds": asdict(thresholds_of(rollout)),
                  "percent": rollout.traffic_percent, "evaluated_at": now.isoformat()}
        # Only the evaluator's own fields: a person may have paused or promoted meanwhile.
        Rollout.objects.filter(pk=rollout.pk).update(
            probe_result=rollout.probe_result, probe_step_index=rollout.probe_step_index,
            last_evaluated_at=now, last_evidence=record)
        if rollout.state != Rollout.State.RUNNING:
            return "paused"
        reason = "; ".join(decision.reasons)
        try:
            if decision.action == ROLLBACK:
                services.rollback_rollout(rollout, actor=services.EVALUATOR, reason=reason,
                                          evidence=record, now=now)
                return "rollback"
            if decision.action == ADVANCE:
                updated = services.advance_rollout(
                    rollout, expected_step_index=rollout.step_index, actor=services.EVALUATOR,
                    reason=reason, evidence=record, now=now)
                return "promote" if updated.state == Rollout.State.PROMOTED else "advance"
        except services.RolloutError as exc:  # a person acted meanwhile: theirs stands
            logger.info("rollout %s: %s", rollout.pk, exc)
            return "superseded"
        return "hold"

    def _open(self, rollout: Rollout, now: datetime) -> str:
        """A rollout waiting for its canary's replicas (services.start_rollout); rolled back
        when none is ready within ROLLOUT_READY_TIMEOUT_SECONDS of its start."""
        if not services.canary_ready(rollout):
            waited_s = (now - rollout.step_started_at).total_seconds()
            limit_s = settings.ROLLOUT_READY_TIMEOUT_SECONDS
            if waited_s >= limit_s:
                reason = (f"no replica of the canary was ready {waited_s:.0f} s after the start "
                          f"(ROLLOUT_READY_TIMEOUT_SECONDS={limit_s:g})")
                try:
                    services.rollback_rollout(rollout, actor=services.EVALUATOR, reason=reason,
                                              evidence={"decision": ROLLBACK,
                                                        "reasons": [reason], "percent": 0.0,
                                                        "evaluated_at": now.isoformat()},
                                              now=now)
                except services.RolloutError as exc:
                    logger.info("rollout %s: %s", rollout.pk, exc)
                    return "superseded"
                return "rollback"
            Rollout.objects.filter(pk=rollout.pk).update(last_evaluated_at=now, last_evidence={
                "decision": HOLD, "reasons": ["waiting for the canary's replicas"],
                "percent": 0.0, "evaluated_at": now.isoformat()})
            return "waiting"
        try:
            services.open_canary(rollout, now=now)
        except services.RolloutError as exc:
            logger.info("rollout %s: %s", rollout.pk, exc)
            return "superseded"
        return "open"
