"""Celery beat's task for rollouts (llm_platform/settings.py schedules it)."""
import redis
from celery import shared_task
from django.conf import settings
from django.utils import timezone

from inference.tokenization import TokenizerCache
from rollouts.evaluator import RolloutEvaluator
from rollouts.replica_quality_probe import ReplicaProbe


@shared_task(ignore_result=True)
def evaluate_rollouts() -> dict[int, str]:
    """Canary evaluator: advance, promote or roll back each running rollout."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        evaluator = RolloutEvaluator(
            clock=timezone.now, redis=client, key_prefix=settings.REDIS_KEY_PREFIX,
            probe=ReplicaProbe(TokenizerCache(), timeout_s=settings.ROLLOUT_PROBE_TIMEOUT_SECONDS))
        return evaluator.evaluate_all()
    finally:
        client.close()
