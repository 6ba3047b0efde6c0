"""The latest hours' usage, read from the usage rows themselves.

Roll-ups (billing/rollups.py) run every few minutes (BILLING_ROLLUP_INTERVAL_SECONDS); until
then the current hour has no roll-up row, or a stale one, and so may the hour just ended. The
dashboard therefore takes the hours before `live_start(now)` from the roll-ups and the last
LIVE_HOURS (the current hour and the one before it) from `billing_usagerecord`. Bounded: one
tenant, at most two hours, through the (tenant, occurred_at) index; the same sums and
percentiles the roll-up computes, so the figures do not jump when the roll-up catches up.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from django.db import connection

LIVE_HOURS = 2

_LIVE = """
SELECT date_trunc('hour', occurred_at), model_name, COUNT(*),
       COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY ttft_ms),
       percentile_cont(0.9) WITHIN GROUP (ORDER BY ttft_ms)
FROM billing_usagerecord
WHERE tenant_id = %s AND occurred_at >= %s AND occurred_at < %s
GROUP BY 1, 2
ORDER BY 1, 2
"""


def live_start(now: datetime) -> datetime:
    """The first hour read from usage rows rather than roll-ups."""
    hour = now.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)
    return hour - timedelta(hours=LIVE_HOURS - 1)


def live_rows(tenant_id: int, now: datetime) -> list[dict]:
    """Per hour and model since live_start(now): requests, input and output tokens, TTFT
    p50/p90 in ms (None when no request had a first token)."""
    start = live_start(now)
    with connection.cursor() as cursor:
        cursor.execute(_LIVE, [tenant_id, start, start + timedelta(hours=LIVE_HOURS)])
        return [{"hour": hour.astimezone(timezone.utc), "model_name": model,
                 "requests": requests, "input_tokens": int(input_tokens),
                 "output_tokens": int(output_tokens), "ttft_p50_ms": p50, "ttft_p90_ms": p90}
                for hour, model, requests, input_tokens, output_tokens, p50, p90
                in cursor.fetchall()]
