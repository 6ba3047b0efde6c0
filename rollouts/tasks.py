"""Celery beat's task for rollouts (llm_platform/settings.py schedules it)."""
from celery import shared_task
from django.conf import settings
from django.utils import timezone

from inference.tokenization import TokenizerCache
from llm_platform.redis_clients import sync_redis
from rollouts.evaluator import RolloutEvaluator
from rollouts.replica_quality_probe import ReplicaProbe


@shared_task(ignore_result=True)
def evaluate_rollouts() -> dict[int, str]:
    """Canary evaluator: advance, promote or roll back each running rollout."""
    client = sync_redis(max_connections=4)  # timeouts: llm_platform/redis_clients.py
    try:
        evaluator = RolloutEvaluator(
            clock=timezone.now, redis=client, key_prefix=settings.REDIS_KEY_PREFIX,
            probe=ReplicaProbe(TokenizerCache(), timeout_s=settings.ROLLOUT_PROBE_TIMEOUT_SECONDS))
        return evaluator.evaluate_all()
    finally:
        client.close()
