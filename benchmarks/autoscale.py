"""Autoscaling: a recorded day replayed against the reactive-only and the reactive + predictive
autoscaler, side by side in one run.

    python -m benchmarks.autoscale [--out FILE.json] [--day-minutes 20] [--no-measure]

1. Measure one real replica (the bundled SmolLM2 in tritonserver through replica.launch's
   ReplicaProcess): load time (start -> ready + one warm-up request, as the node agent does),
   and TTFT and per-request time with `--slots` requests at once.
2. Replay a day compressed into `--day-minutes` (night trough, morning ramp, lunch spike,
   afternoon, evening decline) with Poisson arrivals, in a discrete-event simulation of the
   fleet (benchmarks/fleet_sim.py) whose every decision is made by the platform's own
   autoscaler code (fleet.scaling_decision.decide, fleet.forecast). The fleet is
   SIMULATED from the measured parameters: on 2 CPU cores more real replicas add no capacity.
   The predictive autoscaler's profile is learned from the recorded day (its rate samples).
3. Report, for both: TTFT p99 of requests that arrived during the ramps (morning ramp and the
   lunch spike's onset), replica-minutes used (cost, in the compressed day's minutes) and
   requests refused (queue full or past the tier's wait bound).
Also in the JSON: the same day with a GPU-like 60 s load time (`gpu_like_load_60s`), where
starting ahead matters most.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

from benchmarks.fleet_sim import ReplicaModel, simulate
from benchmarks.stream_client import percentile
from fleet.scaling_decision import PolicyView
from fleet.forecast import build_profile

HOUR = 1.0 / 24.0
PROMPT = "Write one short sentence about the sea, then stop."


def day_shape(f: float) -> float:
    """The recorded day's rate as a fraction of its peak; `f` is the fraction of the day."""
    h = f * 24.0
    if h < 6:
        return 0.08
    if h < 7:
        return 0.08 + 0.07 * (h - 6)
    if h < 10:  # morning ramp
        return 0.15 + 0.45 * (h - 7) / 3
    if h < 12:
        return 0.6
    if h < 13:  # lunch spike
        return 1.0
    if h < 17:
        return 0.55
    if h < 22:  # evening decline
        return 0.55 - 0.4 * (h - 17) / 5
    return 0.08


def is_ramp_hour(h: float) -> bool:
    return 7 <= h < 10 or 11.9 <= h < 12.5


def measure_replica(slots: int, max_tokens: int) -> dict:
    from inference.replica_client import ReplicaRequest
    from inference.triton_client import TritonReplicaClient
    from replica.replica_process import ReplicaProcess, ReplicaSpec
    from replica.backend.model_parameters import ModelParameters
    from scripts.services import free_port

    spec = ReplicaSpec(model_name="chat-small", grpc_port=free_port(), http_port=free_port(),
                       metrics_port=free_port(), parameters=ModelParameters(num_threads=0),
                       drain_grace_s=5.0)

    def request(i: int, n: int) -> ReplicaRequest:
        return ReplicaRequest(request_id=f"bench-{i}-{time.monotonic_ns()}", model_name="chat-small",
                              prompt_text=PROMPT, prompt_token_ids=None, max_tokens=n,
                              temperature=0.0, top_p=1.0, seed=0, stop=(), priority=0,
                              tenant="bench")

    async def one(client, address: str, i: int, n: int) -> tuple[float, float]:
        start = time.perf_counter()
        first = None
        async for chunk in client.stream(address, request(i, n)):
            if first is None:
                first = time.perf_counter() - start
            if chunk.final:
                break
        return first, time.perf_counter() - start

    async def run(address: str) -> dict:
        client = TritonReplicaClient(first_token_timeout=120, token_timeout=60)
        try:
            started = time.perf_counter()
            await one(client, address, -1, 2)  # the warm-up request the agent sends
            warm_up_s = time.perf_counter() - started
            rounds = []
            for r in range(3):
                rounds += await asyncio.gather(*(one(client, address, r * slots + i, max_tokens)
                                                 for i in range(slots)))
            return {"warm_up_s": warm_up_s, "ttft_s": statistics.mean(t for t, _ in rounds),
                    "service_s": statistics.mean(d for _, d in rounds)}
        finally:
            await client.close()

    replica = ReplicaProcess(spec)
    started = time.perf_counter()
    replica.start()
    try:
        replica.wait_ready(timeout_s=600)
        ready_s = time.perf_counter() - started
        measured = asyncio.run(run(replica.grpc_url))
    finally:
        replica.stop(grace_s=2.0)
    return {"load_s": ready_s + measured["warm_up_s"], "triton_ready_s": ready_s, **measured}


def _poisson(rng: random.Random, lam: float) -> int:
    if lam > 30:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    threshold, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= threshold:
            return k
        k += 1


def run_pair(model: ReplicaModel, args, peak_rps: float, day_s: float) -> dict:
    rate = lambda t: peak_rps * day_shape(t / day_s)  # noqa: E731
    # The recorded day: per-tick request counts (Poisson, its own seed) as RateSamples would hold.
    rng = random.Random(args.seed + 1)
    samples = []
    t = 0.0
    while t < day_s:
        expected = rate(t + args.tick_s / 2) * args.tick_s
        count = _poisson(rng, expected)
        samples.append((t + args.tick_s, args.tick_s, count))
        t += args.tick_s
    profile = build_profile(samples, period_s=day_s, bin_s=day_s / 96)
    out = {}
    for name, predictive in (("reactive", False), ("predictive", True)):
        policy = PolicyView(
            min_replicas=1, max_replicas=args.max_replicas, warm_pool_size=args.warm_pool,
            predictive=predictive, target_queue_depth=max(1, model.slots // 2),
            target_outstanding_tokens=model.slots * model.tokens_per_request,
            replica_capacity_rps=model.capacity_rps * args.target_utilisation,
            scale_up_cooldown_s=args.tick_s, scale_down_cooldown_s=day_s / 24)
        result = simulate(rate=rate, day_s=day_s, model=model, policy=policy,
                          profile=profile if predictive else None,
                          is_ramp=lambda t: is_ramp_hour(t / day_s * 24), tick_s=args.tick_s,
                          max_queue=args.max_queue, max_wait_s=args.max_wait_s, seed=args.seed)
        ramp = result.ttft_ramp
        out[name] = {
            "ttft_p99_ramp_s": round(percentile(ramp, 99), 3) if ramp else None,
            "ttft_p50_ramp_s": round(percentile(ramp, 50), 3) if ramp else None,
            "ttft_p99_all_s": round(percentile(result.ttft_all, 99), 3) if result.ttft_all else 0.0,
            "replica_minutes": round(result.replica_seconds / 60.0, 2),
            "refused": result.refused,
            "arrived": result.arrived,
            "served": result.served,
            "scaling_actions": len(result.decisions),
            "max_replicas_used": max(r + l for _, r, l in result.timeline),
            "first_decisions": result.decisions[:8],
        }
    r, p = out["reactive"], out["predictive"]
    out["ratios"] = {
        "ttft_p99_ramp_reactive_over_predictive": (
            round(r["ttft_p99_ramp_s"] / p["ttft_p99_ramp_s"], 2) if p["ttft_p99_ramp_s"] else None),
        "replica_minutes_predictive_over_reactive": round(p["replica_minutes"] / r["replica_minutes"], 3),
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--day-minutes", type=float, default=20.0)
    parser.add_argument("--slots", type=int, default=4, help="requests one replica runs at once")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--peak-replicas", type=float, default=6.0,
                        help="the lunch peak needs about this many replicas")
    parser.add_argument("--max-replicas", type=int, default=10)
    parser.add_argument("--warm-pool", type=int, default=0)
    parser.add_argument("--tick-s", type=float, default=5.0, help="autoscaler interval")
    parser.add_argument("--target-utilisation", type=float, default=0.8)
    parser.add_argument("--max-queue", type=int, default=256)
    parser.add_argument("--max-wait-s", type=float, default=5.0, help="the tier's queue wait bound")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-measure", action="store_true",
                        help="skip the real replica; use --load-s/--service-s/--ttft-s")
    parser.add_argument("--load-s", type=float, default=4.0)
    parser.add_argument("--service-s", type=float, default=2.0)
    parser.add_argument("--ttft-s", type=float, default=0.3)
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run (seconds) that only proves the benchmark still works")
    args = parser.parse_args(argv)
    if args.smoke:  # the given replica parameters, a day compressed into one minute
        args.no_measure, args.day_minutes = True, 1.0

    if args.no_measure:
        measured = {"load_s": args.load_s, "service_s": args.service_s, "ttft_s": args.ttft_s,
                    "source": "given on the command line (--no-measure)"}
    else:
        print("measuring one real SmolLM2 replica ...", file=sys.stderr, flush=True)
        measured = {**measure_replica(args.slots, args.max_tokens), "source": "measured"}
    model = ReplicaModel(load_s=measured["load_s"], slots=args.slots, service_s=measured["service_s"],
                         ttft_s=measured["ttft_s"], tokens_per_request=40 + args.max_tokens)
    day_s = args.day_minutes * 60.0
    peak_rps = args.peak_replicas * model.capacity_rps * args.target_utilisation
    started = time.perf_counter()
    result = run_pair(model, args, peak_rps, day_s)
    gpu_like = run_pair(ReplicaModel(60.0, model.slots, model.service_s, model.ttft_s,
                                     model.tokens_per_request), args, peak_rps, day_s)
    report = {
        "note": ("fleet SIMULATED from one real replica's measured parameters (2 CPU cores: more "
                 "real replicas add no capacity); every scaling decision is the platform's own "
                 "autoscaler code (fleet.scaling_decision.decide + forecast) on a simulated "
                 "clock; the day is compressed into day_minutes, load and service times are real "
                 "seconds"),
        "reactive": result["reactive"],
        "predictive": result["predictive"],
        "ratios": result["ratios"],
        "gpu_like_load_60s": gpu_like,
        "replica": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in measured.items()},
        "settings": {"day_minutes": args.day_minutes, "slots": args.slots,
                     "max_tokens": args.max_tokens, "capacity_rps_per_replica": round(model.capacity_rps, 3),
                     "peak_rps": round(peak_rps, 3), "tick_s": args.tick_s,
                     "max_wait_s": args.max_wait_s, "max_queue": args.max_queue,
                     "max_replicas": args.max_replicas, "warm_pool": args.warm_pool,
                     "seed": args.seed, "cpu_count": os.cpu_count(),
                     "simulation_s": round(time.perf_counter() - started, 2)},
    }
    text = json.dumps(report, indent=1)
    print(text)
    r, p = report["reactive"], report["predictive"]
    print(f"\nSIMULATED fleet from measured replica parameters (load {model.load_s:.1f}s, "
          f"{model.capacity_rps:.2f} req/s per replica)\n"
          f"  reactive:   TTFT p99 in ramps {r['ttft_p99_ramp_s']}s, {r['replica_minutes']} "
          f"replica-min, {r['refused']} refused\n"
          f"  predictive: TTFT p99 in ramps {p['ttft_p99_ramp_s']}s, {p['replica_minutes']} "
          f"replica-min, {p['refused']} refused", file=sys.stderr)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
