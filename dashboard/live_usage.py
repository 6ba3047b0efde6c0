"""The current hour's usage, read from the usage rows themselves.

Roll-ups (billing/rollups.py) run every few minutes; until then the current hour has no roll-up
row, or a stale one. The dashboard therefore takes every hour before the current one from the
roll-ups and the current hour from `billing_usagerecord`. Bounded: one tenant, one hour, through
the (tenant, occurred_at) index; the same sums and percentiles the roll-up computes, so the
figures do not jump when the roll-up catches up.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from django.db import connection

_CURRENT_HOUR = """
SELECT model_name, COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0),
       COUNT(ttft_ms),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY ttft_ms),
       percentile_cont(0.9) WITHIN GROUP (ORDER BY ttft_ms)
FROM billing_usagerecord
WHERE tenant_id = %s AND occurred_at >= %s AND occurred_at < %s
GROUP BY model_name
ORDER BY model_name
"""


def hour_start(now: datetime) -> datetime:
    return now.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)


def current_hour_rows(tenant_id: int, now: datetime) -> list[dict]:
    """Per model: requests, input and output tokens, TTFT p50/p90 (ms) and how many requests
    had a TTFT, for the hour that contains `now`."""
    start = hour_start(now)
    with connection.cursor() as cursor:
        cursor.execute(_CURRENT_HOUR, [tenant_id, start, start + timedelta(hours=1)])
        return [{"model_name": model, "hour": start, "requests": requests,
                 "input_tokens": int(input_tokens), "output_tokens": int(output_tokens),
                 "ttft_count": ttft_count, "ttft_p50_ms": p50, "ttft_p90_ms": p90}
                for model, requests, input_tokens, output_tokens, ttft_count, p50, p90
                in cursor.fetchall()]
