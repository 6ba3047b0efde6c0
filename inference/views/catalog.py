"""GET /v1/models, /v1/models/{id}, /health, /healthz, /readyz."""
from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db import connection
from django.http import JsonResponse

from inference.container import current_container
from inference.errors import NotFound
from inference.pipeline import authenticate_header
from inference.views.errors import api_endpoint
from models_registry.selectors import any_ready_replica, models_for_tenant


@api_endpoint("GET")
async def models_view(request):
    container = current_container()
    principal = await authenticate_header(container, request.headers.get("Authorization"))
    return JsonResponse({"object": "list", "data": await models_for_tenant(principal.tenant_id)})


@api_endpoint("GET")
async def model_view(request, model_id: str):
    """One model object; 404 (not one the key's tenant may use) exactly as /v1/models omits it."""
    container = current_container()
    principal = await authenticate_header(container, request.headers.get("Authorization"))
    for model in await models_for_tenant(principal.tenant_id):
        if model["id"] == model_id:
            return JsonResponse(model)
    raise NotFound(f"The model '{model_id}' does not exist or you do not have access to it.",
                   param="model")


@api_endpoint("GET")
async def healthz_view(request):
    """Liveness (also at /health, the path LLM servers and load generators probe): the
    process answers; no dependency is checked (that is /readyz)."""
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
