"""Reads the evaluator needs: per-version request stats from the usage rows (PostgreSQL
computes the percentiles) plus the canary's fallbacks (Redis)."""
from __future__ import annotations

from datetime import datetime

from django.db import connection

from billing.models import UsageRecord
from rollouts.decision import VersionStats
from inference.fallbacks import FAILED, UNAVAILABLE

# TPOT of a request: the time after its first token over the tokens after the first.
_STATS_SQL = """
SELECT model_version_id,
       count(*) FILTER (WHERE status IN ('ok', 'failed')),
       count(*) FILTER (WHERE status = 'failed'),
       percentile_cont(0.9) WITHIN GROUP (ORDER BY ttft_ms)
           FILTER (WHERE status = 'ok' AND ttft_ms IS NOT NULL),
       percentile_cont(0.9) WITHIN GROUP (ORDER BY (total_ms - ttft_ms) / (output_tokens - 1))
           FILTER (WHERE status = 'ok' AND ttft_ms IS NOT NULL AND output_tokens > 1)
FROM {table}
WHERE model_version_id IN (%s, %s) AND occurred_at >= %s AND occurred_at <= %s
GROUP BY model_version_id
"""


def version_stats(stable_version_id: int, canary_version_id: int, since: datetime,
                  until: datetime) -> dict[int, VersionStats]:
    """Stats of both versions over [since, until] by usage time (`occurred_at`)."""
    stats = {stable_version_id: VersionStats(), canary_version_id: VersionStats()}
    with connection.cursor() as cursor:
        cursor.execute(_STATS_SQL.format(table=UsageRecord._meta.db_table),
                       [stable_version_id, canary_version_id, since, until])
        for version_id, num_requests, num_failed, ttft_p90, tpot_p90 in cursor.fetchall():
            stats[version_id] = VersionStats(
                num_requests=num_requests, num_failed=num_failed,
                ttft_p90_ms=None if ttft_p90 is None else float(ttft_p90),
                tpot_p90_ms=None if tpot_p90 is None else float(tpot_p90))
    return stats


def with_fallbacks(canary: VersionStats, fallbacks: dict[str, int]) -> VersionStats:
    return VersionStats(
        num_requests=canary.num_requests, num_failed=canary.num_failed,
        num_fallbacks_failed=fallbacks.get(FAILED, 0),
        num_fallbacks_unavailable=fallbacks.get(UNAVAILABLE, 0),
        ttft_p90_ms=canary.ttft_p90_ms, tpot_p90_ms=canary.tpot_p90_ms)
