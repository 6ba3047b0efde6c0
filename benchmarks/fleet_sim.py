"""A discrete-event simulation of one model version's fleet, driven by the real autoscaler.

On 2 CPU cores more real replicas add no real capacity, so benchmarks.autoscale measures one
real replica (load time, TTFT and per-request time at a given concurrency) and replays a day
here. What is simulated: Poisson arrivals at a day's rate curve, a shared FIFO admission queue
(bounded; a request waiting past the tier's bound is refused), replicas that each run `slots`
requests at once for `service_s` each (TTFT = queue wait + `ttft_s`), replicas that take
`load_s` to become ready and drain before they stop. What is NOT simulated: the decision, which
is `fleet.scaling_decision.decide` with the forecast of `fleet.forecast`, fed the
same load readings the Celery task computes (queue depth, outstanding tokens, TTFT p90, arrival rate,
idle time, measured load time, the forecast's peak over the coming load window).
"""
from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from benchmarks.stream_client import percentile
from fleet.scaling_decision import History, PolicyView, LoadReadings, decide
from fleet.forecast import TimeOfDayProfile

TTFT_WINDOW_S = 20.0  # the compressed day's equivalent of the task's one-minute window
RATE_WINDOW_TICKS = 3  # the arrival rate is the mean over the last ticks (fleet.load_readings.recent_rate)


@dataclass(frozen=True)
class ReplicaModel:
    load_s: float  # start -> ready (warm-up included)
    slots: int  # requests one replica runs at once
    service_s: float  # one request's time with `slots` running
    ttft_s: float  # time to first token once admitted, with `slots` running
    tokens_per_request: int  # prompt + max_tokens, for outstanding tokens

    @property
    def capacity_rps(self) -> float:
        return self.slots / self.service_s


@dataclass
class SimReplica:
    rid: int
    state: str  # loading | ready | draining
    started: float
    busy: int = 0


@dataclass
class Result:
    ttft_ramp: list[float] = field(default_factory=list)
    ttft_all: list[float] = field(default_factory=list)
    refused: int = 0
    served: int = 0
    arrived: int = 0
    replica_seconds: float = 0.0
    decisions: list[tuple[float, str, int, str]] = field(default_factory=list)
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (t, ready, loading)


def simulate(*, rate: Callable[[float], float], day_s: float, model: ReplicaModel,
             policy: PolicyView, profile: TimeOfDayProfile | None, is_ramp: Callable[[float], bool],
             tick_s: float, max_queue: int, max_wait_s: float, seed: int,
             start_replicas: int = 1) -> Result:
    rng = random.Random(seed)
    result = Result()
    seq = itertools.count()
    events: list = []  # (time, seq, kind, payload)

    def push(t, kind, payload=None):
        heapq.heappush(events, (t, next(seq), kind, payload))

    replicas: dict[int, SimReplica] = {}
    next_rid = itertools.count()
    queue: deque[float] = deque()  # arrival times
    finished: deque[tuple[float, float]] = deque()  # (time, ttft) for the TTFT window
    history = History()
    arrivals_since_tick = 0
    recent_arrivals: deque[int] = deque(maxlen=RATE_WINDOW_TICKS)
    last_arrival: float | None = None

    def add_replica(now: float, ready: bool) -> None:
        rid = next(next_rid)
        replicas[rid] = SimReplica(rid, "ready" if ready else "loading", now)
        if not ready:
            push(now + model.load_s, "ready", rid)

    for _ in range(start_replicas):
        add_replica(0.0, ready=True)

    def dispatch(now: float) -> None:
        while queue:
            free = [r for r in replicas.values() if r.state == "ready" and r.busy < model.slots]
            if not free:
                return
            arrived = queue.popleft()
            if now - arrived > max_wait_s:
                result.refused += 1
                continue
            replica = min(free, key=lambda r: (r.busy, r.rid))
            replica.busy += 1
            ttft = now - arrived + model.ttft_s * rng.uniform(0.8, 1.2)
            result.ttft_all.append(ttft)
            if is_ramp(arrived % day_s):
                result.ttft_ramp.append(ttft)
            finished.append((now, ttft))
            push(now + model.service_s * rng.uniform(0.8, 1.2), "done", replica.rid)

    def next_arrival(now: float) -> float:
        # Thinning against the day's highest rate: exact for a time-varying Poisson process.
        peak = max_rate
        t = now
        while True:
            t += rng.expovariate(peak)
            if rng.random() * peak <= rate(t % day_s) or t > now + day_s:
                return t

    max_rate = max(rate(t) for t in _grid(day_s, 1.0))
    push(next_arrival(0.0), "arrival")
    push(0.0, "tick")
    last_t = 0.0
    while events:
        now, _, kind, payload = heapq.heappop(events)
        if now > day_s:
            break
        result.replica_seconds += (now - last_t) * len(replicas)
        last_t = now
        if kind == "arrival":
            result.arrived += 1
            arrivals_since_tick += 1
            last_arrival = now
            if len(queue) >= max_queue:
                result.refused += 1
            else:
                queue.append(now)
                dispatch(now)
            push(next_arrival(now), "arrival")
        elif kind == "done":
            replica = replicas.get(payload)
            if replica is not None:
                replica.busy -= 1
                result.served += 1
                if replica.state == "draining" and replica.busy == 0:
                    del replicas[payload]
            dispatch(now)
        elif kind == "ready":
            replica = replicas.get(payload)
            if replica is not None and replica.state == "loading":
                replica.state = "ready"
                dispatch(now)
        elif kind == "tick":
            while queue and now - queue[0] > max_wait_s:  # the tier's wait bound: 503
                queue.popleft()
                result.refused += 1
            while finished and finished[0][0] < now - TTFT_WINDOW_S:
                finished.popleft()
            ready = [r for r in replicas.values() if r.state == "ready"]
            loading = [r for r in replicas.values() if r.state == "loading"]
            ttft_p90 = percentile([f[1] for f in finished], 90) if finished else None
            recent_arrivals.append(arrivals_since_tick)
            forecast = None
            if policy.predictive and profile is not None:
                forecast = profile.peak(now, now + model.load_s + 2 * tick_s)
            readings = LoadReadings(
                num_ready=len(ready), num_loading=len(loading), queue_depth=len(queue),
                outstanding_tokens=sum(r.busy for r in ready) * model.tokens_per_request,
                ttft_p90_s=ttft_p90, ttft_target_s=max_wait_s / 5, ttft_window_s=TTFT_WINDOW_S,
                request_rate_rps=sum(recent_arrivals) / (len(recent_arrivals) * tick_s),
                idle_for_s=math.inf if last_arrival is None else now - last_arrival,
                load_seconds=model.load_s, forecast_rps=forecast)
            decision = decide(policy, readings, now, history)
            arrivals_since_tick = 0
            history = History(
                last_scale_up_at=now if decision.action == "scale_up" else history.last_scale_up_at,
                last_scale_down_at=now if decision.action == "scale_down" else history.last_scale_down_at,
                recommendations=tuple((t, r) for t, r in history.recommendations
                                      if t >= now - policy.scale_down_cooldown_s)
                + ((now, decision.recommended),))
            if decision.action != "hold":
                result.decisions.append((round(now, 1), decision.action, decision.desired, decision.reason))
            for _ in range(decision.delta):
                add_replica(now, ready=False)
            if decision.delta < 0:
                serving = loading + sorted(ready, key=lambda r: (r.busy, -r.rid))
                for victim in serving[:-decision.delta]:
                    if victim.busy == 0:
                        del replicas[victim.rid]
                    else:
                        victim.state = "draining"
            result.timeline.append((round(now, 1), len(ready), len(loading)))
            push(now + tick_s, "tick")
    result.replica_seconds += (day_s - last_t) * len(replicas)
    return result


def _grid(end: float, step: float):
    t = 0.0
    while t <= end:
        yield t
        t += step
