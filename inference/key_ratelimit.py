"""django-ratelimit in front of the API: a request rate per API key (settings.API_KEY_RATELIMIT).

A coarse guard against a runaway client; the per-tenant token buckets (inference/quota.py)
carry the contractual limits. Counted in Django's cache (Redis), so every process shares it.

Invariants: the count is keyed on the authenticated key's id, so spellings of one key
(`Bearer` vs `bearer`, extra spaces) share one count and junk headers create none; every request
counts, HTTP and WebSocket alike (pipeline.prepare calls it right after authentication).
django-ratelimit's core is sync; it runs on a thread.
"""
from __future__ import annotations

from asgiref.sync import sync_to_async
from django.conf import settings
from django_ratelimit.core import get_usage

from inference.errors import RateLimited

GROUP = "api-key"


def _usage(api_key_id: int):
    return get_usage(None, group=GROUP, key=lambda group, request: str(api_key_id),
                     rate=settings.API_KEY_RATELIMIT, increment=True)


async def check_key_rate(api_key_id: int) -> None:
    """Count one request of this key; RateLimited (429 with Retry-After) over the rate."""
    if not settings.API_KEY_RATELIMIT:
        return
    usage = await sync_to_async(_usage, thread_sensitive=False)(api_key_id)
    if usage is not None and usage["should_limit"]:
        retry_after = max(1, int(usage["time_left"]))
        raise RateLimited(
            f"Too many requests with this API key ({settings.API_KEY_RATELIMIT}).",
            code="api_key_rate_exceeded", headers={"Retry-After": str(retry_after)})
