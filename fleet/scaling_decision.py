"""The autoscaler's decision: how many replicas (ready + loading) a model version should have.

Pure: one function of a policy, the load readings now, the forecast and the recent history;
time is plain seconds from an injected clock, so tests and the benchmark's simulation drive the
very code Celery beat runs.

Recommendation = clamp(max(reactive, predictive) + warm pool, min, max), where
- reactive needs: the recent arrival rate / one replica's capacity; outstanding tokens / the
  per-replica target; with requests queued, the ready replicas + queue depth / per-replica
  target; with TTFT p90 above the tier target, one more than ready;
- predictive need: the forecast's peak rate over [now, now + load time + a tick] / capacity, so
  a replica started now is ready when that load arrives;
- scale to zero: no load need and no arrival for `scale_to_zero_after_s` -> 0 (warm pool and
  min ignored); any queued request at zero -> at least one at once.
Cool-downs (no flapping): scale up at most once per `scale_up_cooldown_s` (never delayed from
zero, and never for replacing replicas lost since the last decision: failed, say, after their
engine died); scale down only to the highest recommendation of the last `scale_down_cooldown_s`, not
within that long of the last scale up, and not below what the arrival rate needs with 25 %
headroom (hysteresis).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


# Scale down only to a fleet whose capacity exceeds the arrival rate by this factor (hysteresis
# against scaling up and down around one rate).
SCALE_DOWN_HEADROOM = 1.25


@dataclass(frozen=True)
class PolicyView:
    min_replicas: int = 1
    max_replicas: int = 4
    warm_pool_size: int = 0
    scale_to_zero: bool = False
    scale_to_zero_after_s: float = 300.0
    predictive: bool = True
    target_queue_depth: int = 4
    target_outstanding_tokens: int = 4096
    replica_capacity_rps: float = 1.0
    scale_up_cooldown_s: float = 15.0
    scale_down_cooldown_s: float = 120.0

    @classmethod
    def from_policy(cls, policy) -> "PolicyView":
        return cls(**{name: getattr(policy, name) for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class LoadReadings:
    """What one autoscaler tick saw of a version (fleet/load_readings.py reads it)."""

    num_ready: int
    num_loading: int
    queue_depth: int = 0
    outstanding_tokens: int = 0
    ttft_p90_s: float | None = None
    ttft_target_s: float | None = None
    ttft_window_s: float = 60.0  # what the p90 was measured over
    request_rate_rps: float = 0.0  # arrivals over the last tick
    idle_for_s: float = math.inf  # since the last arrival
    load_seconds: float = 60.0  # this version's measured start -> ready
    forecast_rps: float | None = None  # the forecast's peak over the coming load window

    @property
    def current(self) -> int:
        return self.num_ready + self.num_loading


@dataclass(frozen=True)
class History:
    last_scale_up_at: float | None = None
    last_scale_down_at: float | None = None
    # (time, recommended) of earlier decisions, any age; only the cool-down window is used.
    recommendations: tuple[tuple[float, int], ...] = ()
    # What the latest decision left the fleet at; fewer now means replicas were lost since.
    last_desired: int | None = None


@dataclass(frozen=True)
class Decision:
    action: str  # scale_up | scale_down | hold
    current: int
    recommended: int
    desired: int
    reason: str
    numbers: dict = field(default_factory=dict)

    @property
    def delta(self) -> int:
        return self.desired - self.current


def _needs(policy: PolicyView, s: LoadReadings, now: float, history: History) -> dict[str, int]:
    needs = {}
    if s.request_rate_rps > 0:
        needs["rate"] = math.ceil(s.request_rate_rps / policy.replica_capacity_rps - 1e-9)
    if s.outstanding_tokens > 0:
        needs["outstanding_tokens"] = math.ceil(s.outstanding_tokens / policy.target_outstanding_tokens)
    if s.queue_depth > 0:
        needs["queue_depth"] = s.num_ready + math.ceil(s.queue_depth / policy.target_queue_depth)
    # A p90 measured over a window that began before the last scale up still holds the
    # requests that scale up was for: acting on it again would overshoot.
    settled = history.last_scale_up_at is None or now - history.last_scale_up_at >= s.ttft_window_s
    if (s.ttft_p90_s is not None and s.ttft_target_s is not None and s.num_ready > 0
            and s.ttft_p90_s > s.ttft_target_s and settled):
        needs["ttft_p90"] = s.num_ready + 1
    if policy.predictive and s.forecast_rps:
        needs["forecast"] = math.ceil(s.forecast_rps / policy.replica_capacity_rps - 1e-9)
    return needs


def recommend(policy: PolicyView, s: LoadReadings, now: float = 0.0,
              history: History = History()) -> tuple[int, str, dict[str, int]]:
    needs = _needs(policy, s, now, history)
    load_need = max(needs.values(), default=0)
    if load_need == 0 and policy.scale_to_zero and s.idle_for_s >= policy.scale_to_zero_after_s:
        return 0, f"idle for {s.idle_for_s:.0f}s: scale to zero", needs
    # With scale to zero on, at least one until idle long enough.
    floor = max(policy.min_replicas, 1) if policy.scale_to_zero else policy.min_replicas
    wanted = max(floor, load_need + policy.warm_pool_size)
    recommended = min(policy.max_replicas, wanted)
    if needs:
        signal = max(needs, key=lambda k: needs[k])
        reason = f"{signal} needs {needs[signal]}"
    else:
        reason = "no load"
    if policy.warm_pool_size and recommended > load_need:
        reason += f", warm pool {policy.warm_pool_size}"
    if recommended == policy.max_replicas and wanted > recommended:
        reason += f", capped at max {policy.max_replicas}"
    elif recommended == floor and floor > load_need:
        reason += f", floor {floor}"
    return recommended, reason, needs


def decide(policy: PolicyView, s: LoadReadings, now: float, history: History) -> Decision:
    recommended, reason, needs = recommend(policy, s, now, history)
    current = s.current
    numbers = {**asdict(s), "needs": needs, "now": now}
    if numbers["idle_for_s"] == math.inf:
        numbers["idle_for_s"] = None  # JSON has no infinity
    if recommended > current:
        since_up = math.inf if history.last_scale_up_at is None else now - history.last_scale_up_at
        lost = 0 if history.last_desired is None else history.last_desired - current
        if current > 0 and since_up < policy.scale_up_cooldown_s and lost > 0:
            # A replacement is no scale up: the fleet goes back to what it was, no further.
            desired = min(recommended, history.last_desired)
            return Decision("scale_up", current, recommended, desired,
                            f"{reason}; replaces {desired - current} lost replica(s) within the "
                            f"scale-up cool-down", numbers)
        if current > 0 and since_up < policy.scale_up_cooldown_s:
            return Decision("hold", current, recommended, current,
                            f"{reason}; scale-up cool-down ({since_up:.0f}s < "
                            f"{policy.scale_up_cooldown_s:.0f}s)", numbers)
        return Decision("scale_up", current, recommended, recommended, reason, numbers)
    if recommended < current:
        window_start = now - policy.scale_down_cooldown_s
        recent = [r for t, r in history.recommendations if t >= window_start]
        stabilized = max([recommended, *recent])
        since_up = math.inf if history.last_scale_up_at is None else now - history.last_scale_up_at
        numbers["stabilized"] = stabilized
        if since_up < policy.scale_down_cooldown_s:
            return Decision("hold", current, recommended, current,
                            f"{reason}; scaled up {since_up:.0f}s ago (< "
                            f"{policy.scale_down_cooldown_s:.0f}s)", numbers)
        if stabilized >= current:
            return Decision("hold", current, recommended, current,
                            f"{reason}; {stabilized} recommended within the last "
                            f"{policy.scale_down_cooldown_s:.0f}s", numbers)
        # Hysteresis: give replicas back only while the rest keep headroom over the rate.
        with_headroom = math.ceil(s.request_rate_rps * SCALE_DOWN_HEADROOM
                                  / policy.replica_capacity_rps - 1e-9)
        target = max(stabilized, min(with_headroom, current))
        numbers["with_headroom"] = with_headroom
        if target >= current:
            return Decision("hold", current, recommended, current,
                            f"{reason}; {current} keep {SCALE_DOWN_HEADROOM - 1:.0%} headroom "
                            f"over the arrival rate", numbers)
        return Decision("scale_down", current, recommended, target, reason, numbers)
    return Decision("hold", current, recommended, current, reason, numbers)
