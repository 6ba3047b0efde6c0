"""Celery beat tasks: hourly roll-ups and monthly invoices (both idempotent)."""
from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from billing.invoicing import issue_invoices
from billing.rollups import rollup_usage


@shared_task
def rollup_usage_task() -> int:
    return rollup_usage(timezone.now(), timedelta(seconds=settings.BILLING_ROLLUP_WINDOW_SECONDS))


@shared_task
def issue_invoices_task() -> list[int]:
    return [invoice.pk for invoice in issue_invoices(timezone.now())]
