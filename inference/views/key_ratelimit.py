"""django-ratelimit in front of the API: a per-key request rate (settings.API_KEY_RATELIMIT).

A coarse guard against a runaway client; the per-tenant token buckets (inference/quota.py)
carry the contractual limits. Counted in Django's cache (Redis), so every process shares it.
django-ratelimit's decorator is sync-only; the async views call its core through a thread.
"""
from __future__ import annotations

from asgiref.sync import sync_to_async
from django.conf import settings
from django_ratelimit.core import get_usage

from inference.errors import RateLimited


def _usage(request):
    return get_usage(request, group="api-key", key="header:authorization",
                     rate=settings.API_KEY_RATELIMIT, method=["POST"], increment=True)


async def check_key_rate(request) -> None:
    if not request.headers.get("Authorization") or not settings.API_KEY_RATELIMIT:
        return
    usage = await sync_to_async(_usage, thread_sensitive=False)(request)
    if usage is not None and usage["should_limit"]:
        retry_after = max(1, int(usage["time_left"]))
        raise RateLimited(
            f"Too many requests with this API key ({settings.API_KEY_RATELIMIT}).",
            code="api_key_rate_exceeded", headers={"Retry-After": str(retry_after)})
