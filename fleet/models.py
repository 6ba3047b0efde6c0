"""The fleet's records: what happened to each replica (ReplicaTransition), why the autoscaler
acted (ScalingDecision) and the request rates the forecast learns from (RateSample).

The tables keep the names they had when these models lived in `models_registry`
(fleet/migrations/0001_initial.py moved them without touching the database)."""
from __future__ import annotations

from django.db import models


class ReplicaTransition(models.Model):
    """One state change of one replica, with its reason; the replica's whole history."""

    replica = models.ForeignKey("models_registry.Replica", on_delete=models.CASCADE,
                                related_name="transitions")
    from_state = models.CharField(max_length=16, blank=True, default="")  # "" = created
    to_state = models.CharField(max_length=16)
    reason = models.CharField(max_length=300)
    at = models.DateTimeField(db_index=True)

    class Meta:
        db_table = "models_registry_replicatransition"
        ordering = ["at", "pk"]

    def __str__(self) -> str:
        return f"replica {self.replica_id}: {self.from_state or '-'} -> {self.to_state} ({self.reason})"


class ScalingDecision(models.Model):
    """One autoscaler tick for one version: what it saw, what it wanted, what it did."""

    class Action(models.TextChoices):
        SCALE_UP = "scale_up"
        SCALE_DOWN = "scale_down"
        HOLD = "hold"

    model_version = models.ForeignKey("models_registry.ModelVersion", on_delete=models.CASCADE,
                                      related_name="scaling_decisions")
    at = models.DateTimeField(db_index=True)
    action = models.CharField(max_length=16, choices=Action.choices)
    current_replicas = models.PositiveIntegerField()  # ready + loading
    recommended_replicas = models.PositiveIntegerField()  # before cool-downs
    desired_replicas = models.PositiveIntegerField()  # after cool-downs: what it acted on
    reason = models.CharField(max_length=300)
    readings = models.JSONField(default=dict)  # the load readings and needs that caused it

    class Meta:
        db_table = "models_registry_scalingdecision"
        ordering = ["-at", "-pk"]

    def __str__(self) -> str:
        return f"{self.model_version} {self.action} {self.current_replicas}->{self.desired_replicas}"


class RateSample(models.Model):
    """Requests that arrived for a version in [at - window_s, at): the forecast's history."""

    model_version = models.ForeignKey("models_registry.ModelVersion", on_delete=models.CASCADE,
                                      related_name="rate_samples")
    at = models.DateTimeField(db_index=True)
    window_s = models.FloatField()
    num_requests = models.PositiveIntegerField()

    class Meta:
        db_table = "models_registry_ratesample"
        ordering = ["at"]
