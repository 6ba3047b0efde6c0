"""observe_generation: the hook generation.py calls once per finished generation."""
from __future__ import annotations

import logging

from inference.observability.buffer import current_buffer
from inference.observability.request_metrics import generation_batch

logger = logging.getLogger(__name__)


def observe_generation(prepared, event, started: float,
                       admitted_at: float | None) -> None:
    """Log one line about the finished generation (its request id, tenant and model come from
    the log context) and add its usage event to the shared metrics; never raises (a Redis
    failure loses these samples, not the reply or its usage row). No I/O: the samples are
    written in the background (buffer.py)."""
    logger.info("generation %s", event.status, extra={
        "endpoint": event.endpoint, "model_version": event.model_version_id,
        "replica": event.replica_id, "input_tokens": event.input_tokens,
        "output_tokens": event.output_tokens, "finish_reason": event.finish_reason,
        "ttft_ms": None if event.ttft_ms is None else round(event.ttft_ms, 1),
        "total_ms": round(event.total_ms, 1)})
    try:
        wait_s = None if admitted_at is None else admitted_at - started
        batch = generation_batch(event, prepared.charge.limits.tier_name, wait_s)
        current_buffer().add(batch)
    except Exception:  # noqa: BLE001 - metrics are best effort
        logger.warning("generation metrics not recorded", exc_info=True)
