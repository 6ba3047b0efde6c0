"""What one finished generation adds to the platform's metrics (see families.py).

Invariant: called once per generation that reached admission, with the same usage event the
billing records, so the counters agree with the usage rows.
"""
from __future__ import annotations

from inference.observability import families as f
from inference.observability.store import Batch


def generation_batch(event, tier: str, admission_wait_s: float | None) -> Batch:
    """`event`: a billing UsageEvent (ttft_ms, total_ms, tokens, status, endpoint, model)."""
    labels = {"model": event.model_name, "model_version": event.model_version_id, "tier": tier}
    batch = Batch()
    batch.inc(f.GENERATIONS, {**labels, "endpoint": event.endpoint, "status": event.status})
    batch.inc(f.PROMPT_TOKENS, labels, event.input_tokens)
    batch.inc(f.CACHED_TOKENS, labels, event.cached_tokens)
    batch.inc(f.OUTPUT_TOKENS, labels, event.output_tokens)
    batch.observe(f.E2E, labels, event.total_ms / 1000.0)
    if admission_wait_s is not None:
        batch.observe(f.ADMISSION_WAIT, labels, max(0.0, admission_wait_s))
    if event.ttft_ms is not None:
        batch.observe(f.TTFT, labels, event.ttft_ms / 1000.0)
        if event.output_tokens > 1:
            batch.observe(f.TPOT, labels,
                          (event.total_ms - event.ttft_ms) / 1000.0 / (event.output_tokens - 1))
    return batch
