"""Tenants, their tiers and their API keys."""
from __future__ import annotations

from django.conf import settings
from django.db import models


class Tier(models.Model):
    """A service class: scheduling priority, latency targets and default limits."""

    name = models.SlugField(max_length=64, unique=True)
    # Lower is served first (the replica's `priority` input has the same convention).
    priority = models.PositiveSmallIntegerField(default=10)
    ttft_target_ms = models.PositiveIntegerField(default=1000)
    tpot_target_ms = models.PositiveIntegerField(default=100)
    requests_per_minute = models.PositiveIntegerField(default=600)
    tokens_per_minute = models.PositiveIntegerField(default=200_000)
    # Bucket capacities (the most a tenant can spend at once); null = one minute's worth.
    request_burst = models.PositiveIntegerField(null=True, blank=True)
    token_burst = models.PositiveIntegerField(null=True, blank=True)
    # The longest a request of this tier waits in the admission queue before a 503.
    max_queue_wait_ms = models.PositiveIntegerField(default=5000)

    class Meta:
        ordering = ["priority", "name"]

    def __str__(self) -> str:
        return self.name


class Tenant(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    tier = models.ForeignKey(Tier, on_delete=models.PROTECT, related_name="tenants")
    is_active = models.BooleanField(default=True)
    # Per-tenant overrides of the tier's limits; null = inherit.
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)
    request_burst = models.PositiveIntegerField(null=True, blank=True)
    token_burst = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ApiKey(models.Model):
    """Only a SHA-256 of the key and its visible prefix are stored; the key is shown once.

    Keys carry 256 bits of randomness, so a fast hash is enough (no password KDF needed).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(max_length=32, unique=True)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # The dashboard playground's own key (one per tenant): its raw value is thrown away at
    # creation, it is never listed to members, and usage made through it is the tenant's.
    is_internal = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.tenant.name})"


class TenantMembership(models.Model):
    """A Django user who may use a tenant's dashboard. A user belongs to one tenant."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="tenant_membership")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "user"]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant}"
