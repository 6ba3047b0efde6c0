import asyncio

from asgiref.sync import sync_to_async
from celery import shared_task
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from llm_platform.redis_clients import sync_redis
from fleet import agent_tasks  # noqa: F401 - registers the node agent's tasks
from fleet.autoscaler import FleetContext, autoscale_all
from fleet.dispatch import CeleryDispatcher
from fleet.health_check import check_replicas
from fleet.nodes import detect_lost_nodes


@shared_task(ignore_result=True)
def check_replica_health() -> dict[int, str]:
    return asyncio.run(_with_usable_connection(check_replicas))


async def _with_usable_connection(check):
    """The async ORM runs in asgiref's one thread-sensitive thread, whose connection Celery's
    per-task cleanup (main thread only) never sees: after a PostgreSQL restart it stayed
    broken and every health check failed ('the connection is closed') until the worker was
    restarted. Drop it there before and after, if it errored or is too old."""
    await sync_to_async(close_old_connections)()
    try:
        return await check()
    finally:
        await sync_to_async(close_old_connections)()


def fleet_context(client) -> FleetContext:
    return FleetContext(redis=client, key_prefix=settings.REDIS_KEY_PREFIX,
                        dispatcher=CeleryDispatcher(), tick_s=settings.AUTOSCALER_INTERVAL_SECONDS,
                        lost_after_s=settings.NODE_LOST_AFTER_SECONDS)


@shared_task(ignore_result=True)
def autoscale() -> list[str]:
    client = sync_redis(max_connections=4)  # timeouts: llm_platform/redis_clients.py
    try:
        return [f"{d.model_version_id}:{d.action}:{d.desired_replicas}"
                for d in autoscale_all(timezone.now(), fleet_context(client))]
    finally:
        client.close()


@shared_task(ignore_result=True)
def detect_lost_nodes_task() -> dict[str, list[int]]:
    return detect_lost_nodes(timezone.now(), lost_after_s=settings.NODE_LOST_AFTER_SECONDS,
                             dispatcher=CeleryDispatcher())
