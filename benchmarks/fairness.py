"""python -m benchmarks.fairness [--out FILE.json]: one tenant's burst must not starve another.

One real SmolLM2 replica, two platform front ends on it (two daphne processes, each with its
own Redis key prefix): `fair` (admission queue `fair_share` with headroom slots, the engine's
per-tenant fair share, newcomer isolation and step interruption) and `unfair` (admission `fifo`
without headroom, one fair-share unit for everybody in the engine, so nobody is ever a
newcomer). Both tenants are in the same tier, so only fair share separates them. Each front
end runs `--rounds` rounds of three phases of `--phase-s` seconds, open loop (requests are sent
on a clock, not after replies), and pools each phase's samples over the rounds (interleaving
keeps a slow minute of this noisy machine from landing on one phase only):
  1. B alone: steady interactive traffic (`--b-rate` requests/s);
  2. A alone: bursting at 10x B's rate (what the replica serves flat out: the capacity);
  3. both.
Reports B's p99 TTFT in phase 3 / phase 1 (`victim_slowdown`, target <= 1.5), A's output
tokens/s in phase 3 as a share of the capacity B left idle (`a_idle_share`: work
conservation), and how many of each tenant's requests were refused (503) or failed.
`a_overloads` says whether A alone asked for more than the replica served (A's requests
refused or waiting); without that the burst measures nothing, so `--max-tokens` defaults to 32
(A asks ~320 output tokens/s; the replica serves ~100 here). The replica runs with
`--replica-threads` torch threads, 1 by default as the node agent launches replicas
(NODE_REPLICA_THREADS): on 2 cores the other core serves daphne and the load generator.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

import httpx

from benchmarks.fleet import REPO, _start, _wait, start_fleet
from scripts.services import free_port

SUBJECTS = ["a lighthouse", "a fox", "the moon", "a robot", "a river", "an old clock"]

CREATE_TENANTS = """
from tenants.services import create_api_key, create_tenant
import json
keys = {}
for name in NAMES:
    tenant = create_tenant(name, "standard")
    tenant.requests_per_minute = tenant.tokens_per_minute = 10**7  # measure scheduling only
    tenant.save()
    keys[name] = create_api_key(tenant).raw_key
print(json.dumps(keys))
"""


@dataclass(frozen=True)
class Sample:
    tenant: str
    status: int  # HTTP status; 0 = the stream failed after it started
    ttft_s: float
    output_tokens: int
    error_code: str = ""


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q % of the values at or below it."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


async def one_request(http: httpx.AsyncClient, base_url: str, tenant: str, key: str,
                      index: int, max_tokens: int) -> Sample:
    body = {"model": "chat-small", "stream": True, "max_tokens": max_tokens, "temperature": 0.0,
            "messages": [{"role": "user", "content":
                          f"Write a short story about {SUBJECTS[index % len(SUBJECTS)]}."}]}
    start = time.perf_counter()
    ttft, tokens, event = None, 0, None
    async with http.stream("POST", base_url + "/v1/generate", json=body,
                           headers={"Authorization": f"Bearer {key}"}) as response:
        if response.status_code != 200:
            await response.aread()
            try:
                code = response.json()["error"]["code"]
            except (ValueError, KeyError, TypeError):
                code = "?"
            return Sample(tenant, response.status_code, time.perf_counter() - start, 0, code)
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "token" and ttft is None:
                ttft = time.perf_counter() - start
            elif line.startswith("data: ") and event == "done":
                tokens = json.loads(line[6:])["usage"]["output_tokens"]
            elif line.startswith("data: ") and event == "error":
                return Sample(tenant, 0, time.perf_counter() - start, 0, "stream_error")
    return Sample(tenant, 200, ttft or 0.0, tokens)


async def phase(http, base_url: str, keys: dict, rates: dict[str, float], seconds: float,
                max_tokens: int) -> tuple[list[Sample], float]:
    """Open loop: each tenant sends at its rate for `seconds`; waits for every reply. A sends
    on the tick; B's requests fall midway between two of A's sends (at 0.55 of its own period,
    A's period being a tenth of it). Both on the tick, B's first request would arrive in the
    same millisecond as the first of A's burst every round (and every B request with one of
    A's): random arrivals rarely meet like that, and two requests arriving at the same instant
    are served as equals, one behind the other."""
    tasks: list[asyncio.Task] = []
    start = time.perf_counter()

    async def sender(tenant: str, rate: float):
        offset = 0.55 / rate if tenant == "B" else 0.0
        for i in range(int(seconds * rate)):
            delay = start + offset + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(
                one_request(http, base_url, tenant, keys[tenant], i, max_tokens)))

    await asyncio.gather(*(sender(t, r) for t, r in rates.items() if r > 0))
    samples = list(await asyncio.gather(*tasks))
    return samples, time.perf_counter() - start


def summarize(samples: list[Sample], wall: float) -> dict:
    out = {}
    for tenant in sorted({s.tenant for s in samples}):
        mine = [s for s in samples if s.tenant == tenant]
        ok = [s for s in mine if s.status == 200]
        out[tenant] = {
            "sent": len(mine), "ok": len(ok),
            "refused_503": sum(s.status == 503 for s in mine),
            "failed": sum(s.status not in (200, 503) for s in mine),
            "error_codes": {c: sum(s.error_code == c for s in mine)
                            for c in sorted({s.error_code for s in mine if s.error_code})},
            "ttft_p50_ms": round(percentile([s.ttft_s for s in ok], 50) * 1000, 1),
            "ttft_p99_ms": round(percentile([s.ttft_s for s in ok], 99) * 1000, 1),
            "output_tokens_per_s": round(sum(s.output_tokens for s in ok) / wall, 2),
        }
    return out


async def measure(base_url: str, keys: dict, args, label: str) -> dict:
    gc.collect()
    gc.freeze()  # the load generator's own full collections must not show up as TTFT
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
    b, a = args.b_rate, 10 * args.b_rate
    plan = (("b_alone", {"B": b}), ("a_alone", {"A": a}), ("both", {"A": a, "B": b}))
    samples: dict[str, list[Sample]] = {name: [] for name, _ in plan}
    walls = dict.fromkeys(samples, 0.0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        await phase(http, base_url, keys, {"B": 1.0}, 2, args.max_tokens)  # warm-up
        for round_no in range(1, args.rounds + 1):
            for name, rates in plan:
                got, wall = await phase(http, base_url, keys, rates, args.phase_s, args.max_tokens)
                samples[name] += got
                walls[name] += wall
                mine = summarize(got, wall)
                shown = ", ".join(f"{t} p50 {v['ttft_p50_ms']} ms p99 {v['ttft_p99_ms']} ms "
                                  f"refused {v['refused_503']}" for t, v in mine.items())
                print(f"[{label}] round {round_no}/{args.rounds} {name}: {shown}", file=sys.stderr,
                      flush=True)
    b_alone = summarize(samples["b_alone"], walls["b_alone"])
    a_alone = summarize(samples["a_alone"], walls["a_alone"])
    both = summarize(samples["both"], walls["both"])
    capacity = a_alone["A"]["output_tokens_per_s"]
    idle = max(1e-9, capacity - both["B"]["output_tokens_per_s"])
    return {
        "victim_slowdown": round(both["B"]["ttft_p99_ms"] / b_alone["B"]["ttft_p99_ms"], 3),
        "victim_p50_slowdown": round(both["B"]["ttft_p50_ms"] / b_alone["B"]["ttft_p50_ms"], 3),
        "a_idle_share": round(both["A"]["output_tokens_per_s"] / idle, 3),
        "capacity_tokens_per_s": capacity,
        "a_demand_tokens_per_s": a * args.max_tokens,
        "a_overloads": a_alone["A"]["refused_503"] > 0,
        "b_alone": b_alone["B"], "a_alone": a_alone["A"], "both": both,
    }


def run(args) -> dict:
    os.environ.update({"ADMISSION_SLOTS_PER_REPLICA": str(args.slots),
                       "ADMISSION_HEADROOM_SLOTS_PER_REPLICA": str(args.headroom),
                       "ADMISSION_POLICY": "fair_share", "ENGINE_FAIR_SHARE": "1"})
    # Its own database: another benchmark's start_fleet would mark this replica stopped.
    fleet = start_fleet("smollm2", database="llm_platform_bench_fairness",
                        replica_args=("--num-threads", str(args.replica_threads)))
    try:
        tag = uuid.uuid4().hex[:6]
        names = {"A": f"burst-{tag}", "B": f"steady-{tag}"}
        script = f"NAMES = {list(names.values())!r}\n" + CREATE_TENANTS
        created = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=REPO, env=fleet.env, check=True,
                                 capture_output=True, text=True).stdout
        raw = json.loads(created.strip().splitlines()[-1])
        keys = {short: raw[name] for short, name in names.items()}
        fair = asyncio.run(measure(fleet.base_url, keys, args, "fair"))
        # One front end at a time: the first one's PostgreSQL connections must not starve the
        # second (under load each in-flight request holds one, and PostgreSQL allows ~100).
        daphne = fleet.procs.pop()
        os.killpg(daphne.pid, signal.SIGTERM)
        daphne.wait(60)
        port = free_port()
        unfair_env = {**fleet.env, "ADMISSION_POLICY": "fifo", "ENGINE_FAIR_SHARE": "0",
                      "ADMISSION_HEADROOM_SLOTS_PER_REPLICA": "0",
                      "REDIS_KEY_PREFIX": fleet.env["REDIS_KEY_PREFIX"] + "unfair:"}
        unfair = _start("daphne-unfair", ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                          "llm_platform.asgi:application"], unfair_env)
        fleet.procs.append(unfair)
        _wait(f"http://127.0.0.1:{port}/readyz", unfair, 60)
        result = {"fair": fair,
                  "unfair": asyncio.run(measure(f"http://127.0.0.1:{port}", keys, args, "unfair"))}
    finally:
        fleet.stop()
    return {
        "victim_slowdown": result["fair"]["victim_slowdown"],
        "victim_slowdown_fairness_off": result["unfair"]["victim_slowdown"],
        "victim_p50_slowdown": result["fair"]["victim_p50_slowdown"],
        "victim_p50_slowdown_fairness_off": result["unfair"]["victim_p50_slowdown"],
        "a_idle_share": result["fair"]["a_idle_share"],
        "a_idle_share_fairness_off": result["unfair"]["a_idle_share"],
        "a_overloads": result["fair"]["a_overloads"] and result["unfair"]["a_overloads"],
        "targets": {"victim_slowdown": "<= 1.5"},
        "settings": {"b_rate_per_s": args.b_rate, "a_rate_per_s": 10 * args.b_rate,
                     "phase_s": args.phase_s, "rounds": args.rounds,
                     "b_samples_per_phase": int(args.phase_s * args.b_rate) * args.rounds,
                     "max_tokens": args.max_tokens, "replica_threads": args.replica_threads,
                     "slots_per_replica": args.slots, "headroom_slots": args.headroom,
                     "cpu_count": os.cpu_count()},
        **result,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--b-rate", type=float, default=1.0, help="B's requests/s")
    parser.add_argument("--phase-s", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of the three phases (samples pooled per phase)")
    parser.add_argument("--replica-threads", type=int, default=1,
                        help="torch threads of the replica (the node agent's default is 1)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--slots", type=int, default=4, help="admission slots per replica")
    parser.add_argument("--headroom", type=int, default=2,
                        help="extra slots per replica for tenants under their fair share of "
                             "the slots")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llm_platform.settings")
    result = run(args)
    for key in ("victim_slowdown", "victim_slowdown_fairness_off", "victim_p50_slowdown",
                "victim_p50_slowdown_fairness_off", "a_idle_share", "a_idle_share_fairness_off",
                "a_overloads"):
        print(f"{key:30s} {result[key]}")
    print(json.dumps({k: result[k] for k in ("fair", "unfair")}, indent=1))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
