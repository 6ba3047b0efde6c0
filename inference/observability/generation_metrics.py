"""observe_generation: the hook generation.py calls once per finished generation."""
from __future__ import annotations

import logging

from inference.observability.request_metrics import generation_batch
from inference.observability.store import MetricStore

logger = logging.getLogger(__name__)


async def observe_generation(container, prepared, event, started: float,
                             admitted_at: float | None) -> None:
    """Add the generation's usage event to the shared metrics; never raises (a Redis failure
    loses these samples, not the reply or its usage row)."""
    try:
        wait_s = None if admitted_at is None else admitted_at - started
        batch = generation_batch(event, prepared.charge.limits.tier_name, wait_s)
        await MetricStore(container.redis, container.key_prefix).write(batch)
    except Exception:  # noqa: BLE001 - metrics are best effort
        logger.warning("generation metrics not recorded", exc_info=True)
