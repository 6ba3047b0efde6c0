"""Reads for the autoscaler: what one model version's fleet looks like now.

Queue depth, arrivals and outstanding tokens come from the request path's shared state in Redis
(the admission queue's hashes, the router's outstanding-token hash); TTFT from recent usage rows;
replica counts and load times from the registry; the forecast from stored rate samples.
`redis` is a synchronous client, injected.
"""
from __future__ import annotations

import math
import statistics
from datetime import datetime, timedelta

from billing.models import UsageRecord
from fleet.scaling_decision import History, LoadReadings
from fleet.forecast import build_profile
from fleet.models import RateSample, ScalingDecision
from models_registry.models import ModelVersion, Replica, ScalingPolicy
from tenants.models import Tier
from common import redis_keys

TTFT_WINDOW_S = 60.0
# The arrival rate is the mean over this long (several ticks): one tick's Poisson noise at a low
# rate would otherwise ask for a replica now and then.
RATE_WINDOW_S = 30.0
FORECAST_PERIODS = 7  # periods of samples the profile learns from


def _arrivals_key(prefix: str, model_version_id: int) -> str:
    return redis_keys.arrivals_baseline(prefix, model_version_id)


def _model_name(model_version_id: int) -> str:
    return ModelVersion.objects.values_list("model__name", flat=True).get(pk=model_version_id)


def count_arrivals(redis, prefix: str, model_version_id: int, now: float) -> tuple[int, float, float | None]:
    """(requests since the previous call, seconds since it, time of the last arrival) from the
    admission queue's per-version counters (the queue is the model's, shared by its versions);
    the first call only sets the baseline (0 requests, 0 s)."""
    stats_key = redis_keys.admission(prefix, _model_name(model_version_id)).stats
    seq, full = redis.hmget(stats_key, [f"seq:{model_version_id}",
                                        f"rejected_full:{model_version_id}"])
    total = int(seq or 0) + int(full or 0)
    key = _arrivals_key(prefix, model_version_id)
    previous = redis.hgetall(key)
    last_arrival = float(previous[b"last_arrival"]) if previous.get(b"last_arrival") else None
    if not previous:
        redis.hset(key, mapping={"total": total, "at": now})
        return 0, 0.0, None
    delta = max(0, total - int(previous[b"total"]))
    elapsed = max(0.0, now - float(previous[b"at"]))
    mapping = {"total": total, "at": now}
    if delta:
        last_arrival = now
        mapping["last_arrival"] = now
    redis.hset(key, mapping=mapping)
    return delta, elapsed, last_arrival


def queue_depth(redis, prefix: str, model_version_id: int) -> int:
    """Waiters for this version in its model's queue (tickets are `tenant:version:uuid`)."""
    tickets = redis.hkeys(redis_keys.admission(prefix, _model_name(model_version_id)).waiting)
    version = str(model_version_id)
    return sum(1 for t in tickets
               if (t.decode() if isinstance(t, bytes) else t).split(":")[1] == version)


def outstanding_tokens(redis, prefix: str, model_version_id: int, replica_ids: list[int]) -> dict[int, int]:
    if not replica_ids:
        return {}
    values = redis.hmget(redis_keys.outstanding_tokens(prefix, model_version_id),
                         [str(i) for i in replica_ids])
    return {rid: max(0, int(v or 0)) for rid, v in zip(replica_ids, values)}


def ttft_p90(model_version_id: int, now: datetime) -> tuple[float | None, float | None]:
    """(TTFT p90 s, the strictest tier target s among the tenants served) over the last minute."""
    rows = list(UsageRecord.objects.filter(
        model_version_id=model_version_id, occurred_at__gte=now - timedelta(seconds=TTFT_WINDOW_S),
        ttft_ms__isnull=False).order_by("-occurred_at").values_list("ttft_ms", "tenant__tier_id")[:2000])
    if not rows:
        return None, None
    ttfts = sorted(r[0] for r in rows)
    p90 = ttfts[min(len(ttfts) - 1, math.ceil(0.9 * len(ttfts)) - 1)] / 1000.0
    target = Tier.objects.filter(pk__in={r[1] for r in rows}).order_by("ttft_target_ms").first()
    return p90, (target.ttft_target_ms / 1000.0 if target else None)


def load_seconds(policy: ScalingPolicy) -> float:
    measured = list(Replica.objects.filter(model_version_id=policy.model_version_id,
                                           load_seconds__isnull=False)
                    .order_by("-pk").values_list("load_seconds", flat=True)[:5])
    return statistics.median(measured) if measured else policy.default_load_seconds


def forecast_peak(policy: ScalingPolicy, now: datetime, horizon_s: float) -> float | None:
    since = now - timedelta(seconds=policy.forecast_period_s * FORECAST_PERIODS)
    samples = [(s.at.timestamp(), s.window_s, s.num_requests) for s in RateSample.objects.filter(
        model_version_id=policy.model_version_id, at__gte=since)]
    if not samples:
        return None
    profile = build_profile(samples, policy.forecast_period_s, policy.forecast_bin_s)
    t = now.timestamp()
    return profile.peak(t, t + horizon_s)


def history(policy: ScalingPolicy, now: datetime) -> History:
    decisions = ScalingDecision.objects.filter(model_version_id=policy.model_version_id)
    up = decisions.filter(action=ScalingDecision.Action.SCALE_UP).first()
    down = decisions.filter(action=ScalingDecision.Action.SCALE_DOWN).first()
    window = decisions.filter(at__gte=now - timedelta(seconds=policy.scale_down_cooldown_s))
    latest = decisions.first()
    return History(
        last_scale_up_at=up.at.timestamp() if up else None,
        last_scale_down_at=down.at.timestamp() if down else None,
        recommendations=tuple((d.at.timestamp(), d.recommended_replicas) for d in window),
        last_desired=latest.desired_replicas if latest else None)


def recent_rate(model_version_id: int, now: datetime) -> float:
    rows = RateSample.objects.filter(model_version_id=model_version_id,
                                     at__gt=now - timedelta(seconds=RATE_WINDOW_S), at__lte=now)
    window = sum(r.window_s for r in rows)
    return sum(r.num_requests for r in rows) / window if window > 0 else 0.0


def read(policy: ScalingPolicy, now: datetime, redis, prefix: str, tick_s: float,
         arrivals: tuple[int, float, float | None]) -> tuple[LoadReadings, dict[int, int]]:
    """One tick's load readings of the policy's version, and its ready replicas' outstanding
    tokens (replica id -> tokens)."""
    mv = policy.model_version_id
    states = list(Replica.objects.filter(model_version_id=mv, state__in=(
        Replica.State.READY, Replica.State.LOADING)).values_list("pk", "state"))
    ready_ids = [pk for pk, state in states if state == Replica.State.READY]
    outstanding = outstanding_tokens(redis, prefix, mv, ready_ids)
    _, _, last_arrival = arrivals
    p90, target = ttft_p90(mv, now)
    load_s = load_seconds(policy)
    t = now.timestamp()
    return LoadReadings(
        num_ready=len(ready_ids),
        num_loading=len(states) - len(ready_ids),
        queue_depth=queue_depth(redis, prefix, mv),
        outstanding_tokens=sum(outstanding.values()),
        ttft_p90_s=p90,
        ttft_target_s=target,
        ttft_window_s=TTFT_WINDOW_S,
        request_rate_rps=recent_rate(mv, now),
        idle_for_s=math.inf if last_arrival is None else max(0.0, t - last_arrival),
        load_seconds=load_s,
        forecast_rps=forecast_peak(policy, now, load_s + 2 * tick_s) if policy.predictive else None,
    ), outstanding
