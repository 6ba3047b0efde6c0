"""GET /v1/models, /healthz, /readyz."""
from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from django.http import JsonResponse

from inference.container import current_container
from inference.faults import preparing
from inference.pipeline import authenticate_header
from inference.relay import request_deadline
from inference.views.errors import api_endpoint
from models_registry.selectors import any_ready_replica, models_for_tenant


@api_endpoint("GET")
async def models_view(request):
    container = current_container()
    async with preparing(request_deadline()):  # 503 in seconds if PostgreSQL or Redis hangs
        principal = await authenticate_header(container, request.headers.get("Authorization"))
        data = await models_for_tenant(principal.tenant_id)
    return JsonResponse({"object": "list", "data": data})


@api_endpoint("GET")
async def healthz_view(request):
    return JsonResponse({"status": "ok"})


def _database_ok() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except Exception:  # noqa: BLE001 - any failure means not ready
        return False


async def _check(check, timeout_s: float) -> bool:
    """A readiness check answers within `timeout_s` (a hung dependency is not ready)."""
    try:
        return bool(await asyncio.wait_for(check, timeout_s))
    except Exception:  # noqa: BLE001 - any failure, or no answer in time, means not ready
        return False


@api_endpoint("GET")
async def readyz_view(request):
    container = current_container()
    timeout_s = settings.REQUEST_PREPARE_TIMEOUT_SECONDS
    checks = {"database": await _check(sync_to_async(_database_ok)(), timeout_s)}
    checks["redis"] = await _check(container.redis.ping(), timeout_s)
    checks["replica"] = checks["database"] and await _check(any_ready_replica(), timeout_s)
    ready = all(checks.values())
    return JsonResponse({"status": "ready" if ready else "not_ready", "checks": checks},
                        status=200 if ready else 503)
