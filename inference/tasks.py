"""Celery beat tasks of the request path's layer."""
from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from inference.usage_reaping import reap_usage


@shared_task
def reap_usage_task() -> int:
    """Finalise pending usage rows whose process died (billing/reaper.py); returns how many."""
    return reap_usage(timezone.now()).finalised
