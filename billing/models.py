"""Usage rows (one per request id), prices, hourly roll-ups and invoices."""
from __future__ import annotations

from django.db import models

# Prices: up to 6 decimals per million tokens. Amounts keep every digit tokens x price / 10^6
# can have, so sums are exact (no rounding anywhere until a payment system asks for cents).
PRICE_FIELD = dict(max_digits=18, decimal_places=6)
AMOUNT_FIELD = dict(max_digits=30, decimal_places=12)


class UsageRecord(models.Model):
    class Status(models.TextChoices):
        # Admitted, not yet finalised: billed nothing yet (tokens 0, the estimate aside); the
        # request's final event or the reaper (billing/reaper.py) finalises it exactly once.
        PENDING = "pending"
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
    input_tokens = models.PositiveIntegerField(default=0)  # cached tokens included
    cached_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    estimated_tokens = models.PositiveIntegerField(default=0)  # charged at admission
    ttft_ms = models.FloatField(null=True, blank=True)  # null: no token was produced
    total_ms = models.FloatField()
    status = models.CharField(max_length=16, choices=Status.choices)
    finish_reason = models.CharField(max_length=16, blank=True, default="")
    endpoint = models.CharField(max_length=64, blank=True, default="")
    occurred_at = models.DateTimeField(db_index=True)  # when the request ended: prices apply
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)  # when billing got it
    # When the row was finalised (null while pending): roll-ups recompute the hours of rows
    # settled since their last run.
    settled_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # Set once, when the row is billed; a row is on exactly one invoice.
    invoice = models.ForeignKey("billing.Invoice", on_delete=models.PROTECT, null=True,
                                blank=True, related_name="usage")

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "created_at"]),
                   models.Index(fields=["tenant", "occurred_at"]),
                   # The reaper's scan: pending rows only, oldest first.
                   models.Index(fields=["created_at"], condition=models.Q(status="pending"),
                                name="billing_usage_pending")]

    def __str__(self) -> str:
        return f"{self.request_id} {self.status} {self.input_tokens}+{self.output_tokens}"


class Price(models.Model):
    """A model version's price from `effective_from` until the next price of that version."""

    model_version = models.ForeignKey("models_registry.ModelVersion", on_delete=models.PROTECT,
                                      related_name="prices")
    effective_from = models.DateTimeField()
    input_per_million = models.DecimalField(**PRICE_FIELD)
    output_per_million = models.DecimalField(**PRICE_FIELD)
    # None: cached input tokens cost the same as other input tokens.
    cached_input_per_million = models.DecimalField(null=True, blank=True, **PRICE_FIELD)
    currency = models.CharField(max_length=3, default="USD")

    class Meta:
        ordering = ["model_version", "-effective_from"]
        constraints = [models.UniqueConstraint(fields=["model_version", "effective_from"],
                                               name="unique_price_start")]

    def __str__(self) -> str:
        return f"{self.model_version} from {self.effective_from:%Y-%m-%d %H:%M}"


class UsageHourly(models.Model):
    """Roll-up: tenant x model version x hour (UTC), recomputed from UsageRecord."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE,
                               related_name="usage_hours")
    model_version = models.ForeignKey("models_registry.ModelVersion", on_delete=models.CASCADE,
                                      related_name="usage_hours")
    model_name = models.CharField(max_length=100)
    hour = models.DateTimeField()
    num_requests = models.PositiveIntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    # Time to first token over the hour's requests that produced one (null: none did).
    ttft_p50_ms = models.FloatField(null=True, blank=True)
    ttft_p90_ms = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-hour"]
        constraints = [models.UniqueConstraint(fields=["tenant", "model_version", "hour"],
                                               name="unique_usage_hour")]
        # (hour): the admin's newest-first list of every tenant without sorting the table.
        indexes = [models.Index(fields=["tenant", "hour"]),
                   models.Index(fields=["hour"], name="billing_usagehourly_hour")]


class Invoice(models.Model):
    """One tenant, one calendar month (UTC). Issued invoices are immutable."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT,
                               related_name="invoices")
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    issued_at = models.DateTimeField()
    total = models.DecimalField(**AMOUNT_FIELD)
    currency = models.CharField(max_length=3, default="USD")

    class Meta:
        ordering = ["-period_start", "tenant"]
        constraints = [models.UniqueConstraint(fields=["tenant", "period_start"],
                                               name="unique_invoice_period")]

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValueError("issued invoices are immutable")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ValueError("issued invoices are immutable")

    def __str__(self) -> str:
        return f"{self.tenant} {self.period_start:%Y-%m} {self.total} {self.currency}"


class InvoiceLine(models.Model):
    class Kind(models.TextChoices):
        USAGE = "usage"  # the period's own usage
        CORRECTION = "correction"  # earlier periods' usage that arrived after their invoice

    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="lines")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    model_name = models.CharField(max_length=100)
    num_requests = models.PositiveIntegerField()
    input_tokens = models.BigIntegerField()
    cached_tokens = models.BigIntegerField()
    output_tokens = models.BigIntegerField()
    amount = models.DecimalField(**AMOUNT_FIELD)

    class Meta:
        ordering = ["invoice", "kind", "model_name"]

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValueError("issued invoice lines are immutable")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ValueError("issued invoice lines are immutable")
