"""GET /v1/models, /healthz, /readyz."""
from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db import connection
from django.http import JsonResponse

from inference.container import current_container
from inference.pipeline import authenticate_header
from inference.views.errors import api_endpoint
from models_registry.selectors import any_ready_replica, models_for_tenant


@api_endpoint("GET")
async def models_view(request):
    container = current_container()
    principal = await authenticate_header(container, request.headers.get("Authorization"))
    return JsonResponse({"object": "list", "data": await models_for_tenant(principal.tenant_id)})


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


@api_endpoint("GET")
async def readyz_view(request):
    container = current_container()
    checks = {"database": await sync_to_async(_database_ok)()}
    try:
        checks["redis"] = bool(await container.redis.ping())
    except Exception:  # noqa: BLE001
        checks["redis"] = False
    try:
        checks["replica"] = checks["database"] and await any_ready_replica()
    except Exception:  # noqa: BLE001
        checks["replica"] = False
    ready = all(checks.values())
    return JsonResponse({"status": "ready" if ready else "not_ready", "checks": checks},
                        status=200 if ready else 503)
