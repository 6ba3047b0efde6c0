"""Canary rollouts: a new version of a model takes a growing share of its traffic (Rollout),
and every change of share is recorded with the evidence that caused it (RolloutStep).

The tables keep the names they had when these models lived in `models_registry`
(rollouts/migrations/0001_initial.py moved them without touching the database).
"""
from __future__ import annotations

from django.db import models
from django.db.models import Q

DEFAULT_STEPS = [5, 25, 50, 100]


def default_steps() -> list[int]:
    return list(DEFAULT_STEPS)


class Rollout(models.Model):
    """Invariants: at most one live (running or paused) rollout per model; the canary is a
    `staging` version while the rollout is live (so `serving_version` keeps answering with the
    stable one); `traffic_percent == steps[step_index]` unless an operator set it by hand."""

    class State(models.TextChoices):
        RUNNING = "running"  # the evaluator may advance, promote or roll back
        PAUSED = "paused"  # the share is frozen; only a person changes it
        PROMOTED = "promoted"  # the canary is the active version; the stable one is retired
        ROLLED_BACK = "rolled_back"  # the canary is retired; stable serves everything

    LIVE_STATES = (State.RUNNING, State.PAUSED)

    model = models.ForeignKey("models_registry.Model", on_delete=models.CASCADE,
                              related_name="rollouts")
    stable_version = models.ForeignKey("models_registry.ModelVersion", on_delete=models.PROTECT,
                                       related_name="rollouts_as_stable")
    canary_version = models.ForeignKey("models_registry.ModelVersion", on_delete=models.PROTECT,
                                       related_name="rollouts_as_canary")
    state = models.CharField(max_length=16, choices=State.choices, default=State.RUNNING)
    # Percent of traffic (0..100) per step; reaching 100 is promotion.
    steps = models.JSONField(default=default_steps)
    step_index = models.PositiveIntegerField(default=0)
    traffic_percent = models.FloatField(default=5.0)
    step_started_at = models.DateTimeField()

    # Thresholds of the evaluator (see rollouts/decision.py).
    window_s = models.PositiveIntegerField(default=600)  # evidence: the last window_s of the step
    step_min_s = models.PositiveIntegerField(default=300)  # least time spent in a step
    min_requests = models.PositiveIntegerField(default=50)  # per version, per step
    max_error_rate_delta = models.FloatField(default=0.02)  # canary - stable, absolute
    max_latency_ratio = models.FloatField(default=1.5)  # canary p90 / stable p90 (TTFT and TPOT)
    latency_slack_ms = models.FloatField(default=25.0)  # absolute allowance over the ratio
    min_agreement = models.FloatField(default=0.8)  # quality probe, 0..1
    probe_max_tokens = models.PositiveIntegerField(default=24)

    # The quality probe of the current step (it runs once per step).
    probe_step_index = models.IntegerField(default=-1)
    probe_result = models.JSONField(default=dict, blank=True)
    last_evaluated_at = models.DateTimeField(null=True, blank=True)
    last_evidence = models.JSONField(default=dict, blank=True)

    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "models_registry_rollout"
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["model"], condition=Q(state__in=["running", "paused"]),
                                    name="one_live_rollout_per_model"),
        ]

    def __str__(self) -> str:
        return (f"{self.model.name} v{self.stable_version.version_number} -> "
                f"v{self.canary_version.version_number} ({self.state}, {self.traffic_percent:g}%)")


class RolloutStep(models.Model):
    """One change of a rollout (or a manual action), with the numbers behind it."""

    class Kind(models.TextChoices):
        START = "start"
        ADVANCE = "advance"
        PROMOTE = "promote"
        ROLLBACK = "rollback"
        PAUSE = "pause"
        RESUME = "resume"

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="history")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    from_percent = models.FloatField()
    to_percent = models.FloatField()
    automatic = models.BooleanField(default=False)  # the evaluator, not a person
    actor = models.CharField(max_length=150, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    evidence = models.JSONField(default=dict, blank=True)
    occurred_at = models.DateTimeField()

    class Meta:
        db_table = "models_registry_rolloutstep"
        ordering = ["rollout", "occurred_at", "pk"]

    def __str__(self) -> str:
        return f"{self.kind} {self.from_percent:g}% -> {self.to_percent:g}%"
