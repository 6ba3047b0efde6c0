import asyncio

import redis
from celery import shared_task
from django.conf import settings
from django.utils import timezone

from models_registry.health import check_replicas


@shared_task(ignore_result=True)
def check_replica_health() -> dict[int, str]:
    return asyncio.run(check_replicas())


@shared_task(ignore_result=True)
def evaluate_rollouts() -> dict[int, str]:
    """Canary evaluator: advance, promote or roll back each running rollout."""
    from inference.tokenization import TokenizerCache  # noqa: PLC0415 - the request path's
    from models_registry.rollouts.evaluator import RolloutEvaluator  # noqa: PLC0415
    from models_registry.rollouts.replica_probe import ReplicaProbe  # noqa: PLC0415

    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        evaluator = RolloutEvaluator(
            clock=timezone.now, redis=client, key_prefix=settings.REDIS_KEY_PREFIX,
            probe=ReplicaProbe(TokenizerCache(), timeout_s=settings.ROLLOUT_PROBE_TIMEOUT_SECONDS))
        return evaluator.evaluate_all()
    finally:
        client.close()
