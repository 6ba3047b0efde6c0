"""GET /v1/models, /v1/models/{id}, /health, /healthz, /readyz, /readyz/web.

Probes, and the question each answers:
- `/health`, `/healthz`: the process is up (answers without touching anything; a liveness probe;
  `/health` is the name vLLM, TGI and llama.cpp answer, which load generators ask for).
- `/readyz/web`: this web process can serve, i.e. it reaches PostgreSQL and Redis (a web pod's
  readiness probe). It never depends on replicas: with scale to zero and no replica ready, the
  web pods must stay in service so that requests reach the admission queue and the autoscaler
  sees the demand.
- `/readyz`: the platform can answer a generation now: PostgreSQL, Redis and at least one ready
  replica (scripts, benchmarks and outside monitors; never a web pod's readiness probe).
"""
from __future__ import annotations

import asyncio
import os

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection
from django.http import JsonResponse

from inference.container import current_container
from inference.errors import NotFound
from inference.faults import preparing
from inference.relay import request_deadline
from inference.views.errors import api_endpoint
from models_registry.selectors import any_ready_replica, models_for_tenant


@api_endpoint("GET")
async def models_view(request):
    container = current_container()
    async with preparing(request_deadline()):  # 503 in seconds if PostgreSQL or Redis hangs
        principal = await container.preparation.authenticate(request.headers.get("Authorization"))
        data = await models_for_tenant(principal.tenant_id)
    return JsonResponse({"object": "list", "data": data})


@api_endpoint("GET")
async def model_view(request, model_id: str):
    """One model object; 404 (not one the key's tenant may use) exactly as /v1/models omits it."""
    container = current_container()
    principal = await container.preparation.authenticate(request.headers.get("Authorization"))
    for model in await models_for_tenant(principal.tenant_id):
        if model["id"] == model_id:
            return JsonResponse(model)
    raise NotFound(f"The model '{model_id}' does not exist or you do not have access to it.",
                   param="model")


@api_endpoint("GET")
async def healthz_view(request):
    """Liveness (also at /health, the path LLM servers and load generators probe): the
    process answers; no dependency is checked (that is /readyz). With
    settings.API_REPORT_PROCESS_ID, also which process answered (several share one port) and
    the class of its event loop (llm_platform/server.py)."""
    if settings.API_REPORT_PROCESS_ID:
        loop = type(asyncio.get_running_loop())
        return JsonResponse({"status": "ok", "pid": os.getpid(),
                             "event_loop": f"{loop.__module__}.{loop.__qualname__}"})
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


async def _web_checks() -> dict[str, bool]:
    timeout_s = settings.REQUEST_PREPARE_TIMEOUT_SECONDS
    checks = {"database": await _check(sync_to_async(_database_ok)(), timeout_s)}
    checks["redis"] = await _check(current_container().redis.ping(), timeout_s)
    return checks


def _readiness(checks: dict[str, bool]) -> JsonResponse:
    ready = all(checks.values())
    return JsonResponse({"status": "ready" if ready else "not_ready", "checks": checks},
                        status=200 if ready else 503)


@api_endpoint("GET")
async def web_readyz_view(request):
    return _readiness(await _web_checks())


@api_endpoint("GET")
async def readyz_view(request):
    checks = await _web_checks()
    timeout_s = settings.REQUEST_PREPARE_TIMEOUT_SECONDS
    checks["replica"] = checks["database"] and await _check(any_ready_replica(), timeout_s)
    return _readiness(checks)
