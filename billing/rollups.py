"""Hourly roll-ups: tenant x model version x hour, recomputed from the usage rows.

Recomputing (not incrementing) makes the task idempotent and late events harmless: every hour
that received a settled row (by `settled_at`: arrival, or finalisation of a pending row) within
the window is summed again from scratch, whatever hour the event itself belongs to. Pending
rows are not usage yet: they count nowhere until finalised.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection, transaction

_UPSERT = """
INSERT INTO billing_usagehourly
    (tenant_id, model_version_id, model_name, hour, num_requests, input_tokens, cached_tokens,
     output_tokens, ttft_p50_ms, ttft_p90_ms)
SELECT tenant_id, model_version_id, MAX(model_name), date_trunc('hour', occurred_at), COUNT(*),
       SUM(input_tokens), SUM(cached_tokens), SUM(output_tokens),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY ttft_ms),
       percentile_cont(0.9) WITHIN GROUP (ORDER BY ttft_ms)
FROM billing_usagerecord
WHERE status <> 'pending' AND date_trunc('hour', occurred_at) IN (
    SELECT DISTINCT date_trunc('hour', occurred_at) FROM billing_usagerecord
    WHERE settled_at >= %s)
GROUP BY tenant_id, model_version_id, date_trunc('hour', occurred_at)
ON CONFLICT (tenant_id, model_version_id, hour) DO UPDATE SET
    model_name = EXCLUDED.model_name, num_requests = EXCLUDED.num_requests,
    input_tokens = EXCLUDED.input_tokens, cached_tokens = EXCLUDED.cached_tokens,
    output_tokens = EXCLUDED.output_tokens, ttft_p50_ms = EXCLUDED.ttft_p50_ms,
    ttft_p90_ms = EXCLUDED.ttft_p90_ms
"""


def rollup_usage(now: datetime, window: timedelta) -> int:
    """Recompute the hours touched by rows that arrived since `now - window`; returns the number
    of hour rows written. The session time zone is UTC (settings.TIME_ZONE), so hours are UTC."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_UPSERT, [now - window])
        return cursor.rowcount
