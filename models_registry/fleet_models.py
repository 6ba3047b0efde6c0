"""The fleet's tables: how a version scales (ScalingPolicy), what happened to each replica
(ReplicaTransition), why the autoscaler acted (ScalingDecision) and the request rates the
forecast learns from (RateSample). Imported by models.py so Django registers them."""
from __future__ import annotations

from django.db import models


class ScalingPolicy(models.Model):
    """How one model version scales. A version without a policy (or with `enabled` off) is left
    alone by the autoscaler: its replicas are whatever was registered by hand."""

    model_version = models.OneToOneField("models_registry.ModelVersion", on_delete=models.CASCADE,
                                         related_name="scaling_policy")
    enabled = models.BooleanField(default=True)
    min_replicas = models.PositiveIntegerField(default=1)
    max_replicas = models.PositiveIntegerField(default=4)
    # Ready replicas kept idle on top of what the load needs (absorb a burst while more load).
    warm_pool_size = models.PositiveIntegerField(default=0)
    # With no traffic for `scale_to_zero_after_s`, go to zero replicas (min_replicas ignored);
    # requests that arrive then wait in the queue while the first replica loads.
    scale_to_zero = models.BooleanField(default=False)
    scale_to_zero_after_s = models.FloatField(default=300.0)
    predictive = models.BooleanField(default=True)  # use the time-of-day forecast
    # Reactive targets, per ready replica.
    target_queue_depth = models.PositiveIntegerField(default=4)
    target_outstanding_tokens = models.PositiveIntegerField(default=4096)
    # What one replica sustains (requests/s) at the tier targets: sizes the fleet from a rate.
    replica_capacity_rps = models.FloatField(default=1.0)
    scale_up_cooldown_s = models.FloatField(default=15.0)
    # Scale down only to the highest recommendation of this window (no flapping).
    scale_down_cooldown_s = models.FloatField(default=120.0)
    # Forecast: the period of the profile (a day; shorter in benchmarks) and its bin width.
    forecast_period_s = models.FloatField(default=86400.0)
    forecast_bin_s = models.FloatField(default=300.0)
    # Replica size, reserved on its node at placement.
    replica_cpu_slots = models.PositiveIntegerField(default=1)
    replica_memory_mib = models.PositiveIntegerField(default=1024)
    # Load time (start -> ready) assumed until a replica of this version was measured.
    default_load_seconds = models.FloatField(default=60.0)

    class Meta:
        verbose_name_plural = "scaling policies"

    def __str__(self) -> str:
        return f"scaling of {self.model_version}"


class ReplicaTransition(models.Model):
    """One state change of one replica, with its reason; the replica's whole history."""

    replica = models.ForeignKey("models_registry.Replica", on_delete=models.CASCADE,
                                related_name="transitions")
    from_state = models.CharField(max_length=16, blank=True, default="")  # "" = created
    to_state = models.CharField(max_length=16)
    reason = models.CharField(max_length=300)
    at = models.DateTimeField(db_index=True)

    class Meta:
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
    signals = models.JSONField(default=dict)  # the numbers that caused it

    class Meta:
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
        ordering = ["at"]

    @property
    def rate_rps(self) -> float:
        return self.num_requests / self.window_s if self.window_s > 0 else 0.0
