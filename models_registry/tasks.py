import asyncio

from celery import shared_task

from models_registry.health import check_replicas


@shared_task(ignore_result=True)
def check_replica_health() -> dict[int, str]:
    return asyncio.run(check_replicas())
