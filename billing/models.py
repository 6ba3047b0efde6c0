"""One row per finished request (finished, failed or cancelled)."""
from __future__ import annotations

from django.db import models


class UsageRecord(models.Model):
    class Status(models.TextChoices):
        OK = "ok"
        FAILED = "failed"
        CANCELLED = "cancelled"
        REJECTED = "rejected"  # refused by the replica (invalid request): no tokens generated

    request_id = models.CharField(max_length=64, unique=True)  # exactly once per request
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="usage")
    api_key = models.ForeignKey("tenants.ApiKey", on_delete=models.PROTECT, related_name="usage")
    model_name = models.CharField(max_length=100)
    model_version = models.ForeignKey(
        "models_registry.ModelVersion", on_delete=models.PROTECT, related_name="usage"
    )
    replica = models.ForeignKey(
        "models_registry.Replica", on_delete=models.SET_NULL, null=True, blank=True,
        related_name="usage",
    )
    input_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    ttft_ms = models.FloatField(null=True, blank=True)  # null: no token was produced
    total_ms = models.FloatField()
    status = models.CharField(max_length=16, choices=Status.choices)
    finish_reason = models.CharField(max_length=16, blank=True, default="")
    endpoint = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "created_at"])]

    def __str__(self) -> str:
        return f"{self.request_id} {self.status} {self.input_tokens}+{self.output_tokens}"
