"""python -m benchmarks.fairness [--out FILE.json]: one tenant's burst must not starve another.

One real SmolLM2 replica, two platform front ends on it (two daphne processes, each with its
own Redis key prefix): `fair` (admission queue `fair_share` with headroom slots, the engine's
per-tenant fair share) and `unfair` (admission `fifo` without headroom, one fair-share unit for
everybody in the engine). Both tenants are in the same tier, so only fair share separates them. Each tenant's
client is a process of its own (they are different customers: B's time to first token must not
include its client's event loop busy with A's burst).

The load follows the machine: first the replica's capacity is measured (requests/s completed
with twice the admission slots in flight, `--calibrate-s`); B then sends `--b-share` (0.2) of
it, steady traffic within its fair share (half), and A `--a-multiple` (10) times its fair share
(5x what the replica serves). B's share leaves room for its requests taking longer while A
fills the batch: above its fair share of the admission slots a request waits for one of A's to
end, as it should (seconds, not a scheduling delay). Each front end runs
rounds of three phases, open loop (requests are sent on a clock, not after replies), the
phase long enough for `--b-samples` (100) of B's requests over the rounds; each phase's samples
are pooled over the rounds (interleaving keeps a slow minute of this noisy machine from
landing on one phase only):
  1. B alone: steady interactive traffic;
  2. A alone: bursting (what the replica serves flat out: the capacity);
  3. both.
Reports B's p99 TTFT in phase 3 / phase 1 (`victim_slowdown`, target <= 1.5), A's output
tokens/s in phase 3 as a share of the capacity B left idle (`a_idle_share`: work
conservation), and how many of each tenant's requests were refused (503) or failed.
`a_overloads` says whether A alone asked for more than the replica served (A's requests
refused or waiting); without that the burst measures nothing. Fairness off runs
`--baseline-rounds` (2) rounds: its slowdown is tens of times, fewer samples show it; 0 skips it. The
replica runs with `--replica-threads` torch threads, 1 by default as the node agent launches
replicas (NODE_REPLICA_THREADS): on 2 cores the other core serves daphne and the clients.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import multiprocessing
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

import httpx

from benchmarks.fleet import REPO, _start, _wait, start_fleet
from benchmarks.stream_client import percentile
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


async def send_phase(http, base_url: str, tenant: str, key: str, rate: float, seconds: float,
                     max_tokens: int, start: float) -> list[Sample]:
    """Open loop: sends at `rate` for `seconds` from `start` (perf_counter), then waits for every
    reply. A sends on the tick; B sends at 0.55 of its own period after it, off A's ticks (A
    sending 25x B's rate by default, three quarters of the way between two of A's sends). Both
    on the tick, B's first request would arrive in the same millisecond as the first of A's
    burst every round (and every B request with one of A's): random arrivals rarely meet like
    that, and two requests arriving at the same instant are served as equals, one behind the
    other."""
    tasks: list[asyncio.Task] = []
    offset = 0.55 / rate if tenant == "B" else 0.0
    for i in range(int(seconds * rate)):
        delay = start + offset + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one_request(http, base_url, tenant, key, i, max_tokens)))
    return list(await asyncio.gather(*tasks))


async def closed_loop(http, base_url: str, tenant: str, key: str, seconds: float,
                      concurrency: int, max_tokens: int) -> tuple[list[Sample], float]:
    """`concurrency` requests in flight back to back for `seconds`: what the replica serves
    flat out. Returns the samples and the wall time until the last reply."""
    start = time.perf_counter()
    samples: list[Sample] = []

    async def worker(w: int) -> None:
        i = w
        while time.perf_counter() - start < seconds:
            samples.append(await one_request(http, base_url, tenant, key, i, max_tokens))
            i += concurrency

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return samples, time.perf_counter() - start


async def _client_loop(conn, base_url: str, tenant: str, key: str, max_tokens: int) -> None:
    loop = asyncio.get_running_loop()
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        while (order := await loop.run_in_executor(None, conn.recv)) is not None:
            if order[0] == "closed":
                conn.send(await closed_loop(http, base_url, tenant, key, *order[1:], max_tokens))
                continue
            start_wall, rate, seconds = order
            start = time.perf_counter() + (start_wall - time.time())
            conn.send(await send_phase(http, base_url, tenant, key, rate, seconds, max_tokens,
                                       start))


def client_process(conn, base_url: str, tenant: str, key: str, max_tokens: int) -> None:
    """One tenant's client, a process of its own: A and B are different customers, and B's
    time to first token must not include its own client's event loop parsing A's burst."""
    gc.collect()
    gc.freeze()  # the client's own full collections must not show up as TTFT
    asyncio.run(_client_loop(conn, base_url, tenant, key, max_tokens))


class Clients:
    """A client process per tenant; `phase` runs one open-loop phase on all of them at once."""

    def __init__(self, base_url: str, keys: dict[str, str], max_tokens: int):
        ctx = multiprocessing.get_context("spawn")
        self.conns: dict = {}
        self.procs: list = []
        for tenant, key in keys.items():
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=client_process, args=(theirs, base_url, tenant, key, max_tokens),
                               daemon=True, name=f"client-{tenant}")
            proc.start()
            self.conns[tenant] = mine
            self.procs.append(proc)

    def phase(self, rates: dict[str, float], seconds: float) -> tuple[list[Sample], float]:
        start_wall = time.time() + 0.2  # both clients start on the same clock
        busy = [t for t, r in rates.items() if r > 0]
        for tenant in busy:
            self.conns[tenant].send((start_wall, rates[tenant], seconds))
        samples = [s for tenant in busy for s in self.conns[tenant].recv()]
        return samples, time.time() - start_wall

    def capacity_rps(self, tenant: str, seconds: float, concurrency: int) -> float:
        """Requests/s the replica completes with `concurrency` of `tenant`'s requests in flight."""
        self.conns[tenant].send(("closed", seconds, concurrency))
        samples, wall = self.conns[tenant].recv()
        ok = [x for x in samples if x.status == 200]
        if not ok:
            raise RuntimeError(f"calibration: none of {len(samples)} requests succeeded "
                               f"({sorted({x.error_code or x.status for x in samples})}); "
                               "see the daphne and replica logs above")
        return len(ok) / wall

    def close(self) -> None:
        for conn in self.conns.values():
            try:
                conn.send(None)
            except OSError:  # that client died (its error is already printed)
                pass
        for proc in self.procs:
            proc.join(30)


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


def measure(base_url: str, keys: dict, args, label: str, rounds: int) -> dict:
    b, a = args.b_rate, args.a_rate
    plan = (("b_alone", {"B": b}), ("a_alone", {"A": a}), ("both", {"A": a, "B": b}))
    samples: dict[str, list[Sample]] = {name: [] for name, _ in plan}
    walls = dict.fromkeys(samples, 0.0)
    clients = Clients(base_url, keys, args.max_tokens)
    try:
        clients.phase({"A": 1.0, "B": 1.0}, 2)  # warm-up
        for round_no in range(1, rounds + 1):
            for name, rates in plan:
                got, wall = clients.phase(rates, args.phase_s)
                samples[name] += got
                walls[name] += wall
                mine = summarize(got, wall)
                shown = ", ".join(f"{t} p50 {v['ttft_p50_ms']} ms p99 {v['ttft_p99_ms']} ms "
                                  f"refused {v['refused_503']}" for t, v in mine.items())
                print(f"[{label}] round {round_no}/{rounds} {name}: {shown}", file=sys.stderr,
                      flush=True)
    finally:
        clients.close()
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


def replica_dtype(metrics_address: str) -> str:
    """The compute dtype the replica's `auto` resolved to (bf16 only where it measured faster),
    as the replica reports it."""
    from inference.replica_signals import parse_info

    text = httpx.get(f"http://{metrics_address}/metrics", timeout=10).text
    return parse_info(text).get("dtype", "?")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return next((line.split(":", 1)[1].strip() for line in fh
                         if line.startswith("model name")), "?")
    except OSError:
        return "?"


def calibrate(base_url: str, keys: dict, args) -> float | None:
    """Sets `args.b_rate` (B at `--b-share` of what the replica serves), `args.a_rate` (A at
    `--a-multiple` times its fair share, half of it) and `args.phase_s` (`--b-samples` of B's
    requests per phase over the rounds) from a measured capacity, unless given: the same load
    shape on a fast machine and a slow one. Returns the capacity (requests/s), None when both
    rates were given."""
    capacity = None
    if args.b_rate is None or args.a_rate is None:
        clients = Clients(base_url, {"A": keys["A"]}, args.max_tokens)
        try:
            # Twice the slots in flight: a request always waits for each freed slot, as under a
            # burst (with just the slots, each reply's round trip would leave the engine idle).
            clients.capacity_rps("A", 5, 2 * args.slots)  # warm-up
            capacity = clients.capacity_rps("A", args.calibrate_s, 2 * args.slots)
        finally:
            clients.close()
        if args.b_rate is None:
            args.b_rate = round(args.b_share * capacity, 3)
        if args.a_rate is None:
            args.a_rate = round(args.a_multiple * capacity / 2, 3)
        print(f"capacity {capacity:.2f} requests/s of {args.max_tokens} tokens", file=sys.stderr,
              flush=True)
    if args.phase_s is None:
        # Half a period over, so that the phase holds ceil(b_samples / rounds) of B's sends.
        args.phase_s = round((math.ceil(args.b_samples / args.rounds) + 0.5) / args.b_rate, 2)
    print(f"B sends {args.b_rate}/s, A {args.a_rate}/s; {args.rounds} rounds of 3 phases of "
          f"{args.phase_s} s (fairness off: {args.baseline_rounds} rounds)", file=sys.stderr,
          flush=True)
    return None if capacity is None else round(capacity, 3)


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
        dtype = replica_dtype(fleet.metrics_address)
        capacity_rps = calibrate(fleet.base_url, keys, args)
        fair = measure(fleet.base_url, keys, args, "fair", args.rounds)
        if not args.baseline_rounds:
            return _result(args, capacity_rps, dtype, {"fair": fair})
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
                  "unfair": measure(f"http://127.0.0.1:{port}", keys, args, "unfair",
                                    args.baseline_rounds)}
    finally:
        fleet.stop()
    return _result(args, capacity_rps, dtype, result)


def _result(args, capacity_rps: float | None, dtype: str, result: dict) -> dict:
    """The JSON of a run; `result` has "fair" and, unless `--baseline-rounds 0`, "unfair"."""
    fair, unfair = result["fair"], result.get("unfair", {})
    return {
        "victim_slowdown": fair["victim_slowdown"],
        "victim_slowdown_fairness_off": unfair.get("victim_slowdown"),
        "victim_p50_slowdown": fair["victim_p50_slowdown"],
        "victim_p50_slowdown_fairness_off": unfair.get("victim_p50_slowdown"),
        "a_idle_share": fair["a_idle_share"],
        "a_idle_share_fairness_off": unfair.get("a_idle_share"),
        "a_overloads": fair["a_overloads"] and unfair.get("a_overloads", True),
        "targets": {"victim_slowdown": "<= 1.5"},
        "settings": {"capacity_requests_per_s": capacity_rps,
                     "b_rate_per_s": args.b_rate, "a_rate_per_s": args.a_rate,
                     "phase_s": args.phase_s, "rounds": args.rounds,
                     "baseline_rounds": args.baseline_rounds,
                     "b_samples_per_phase": int(args.phase_s * args.b_rate) * args.rounds,
                     "replica_dtype": dtype, "cpu": cpu_model(),
                     "max_tokens": args.max_tokens, "replica_threads": args.replica_threads,
                     "slots_per_replica": args.slots, "headroom_slots": args.headroom,
                     "cpu_count": os.cpu_count(), "load_average_at_end": os.getloadavg()},
        **result,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--b-rate", type=float, default=None,
                        help="B's requests/s (default: --b-share of the measured capacity)")
    parser.add_argument("--b-share", type=float, default=0.2,
                        help="B's rate as a share of the requests/s the replica serves")
    parser.add_argument("--a-rate", type=float, default=None,
                        help="A's requests/s (default: --a-multiple of its fair share)")
    parser.add_argument("--a-multiple", type=float, default=10.0,
                        help="A's rate over its fair share (half the measured capacity)")
    parser.add_argument("--calibrate-s", type=float, default=20.0,
                        help="how long the capacity is measured (closed loop, 2 x --slots in flight)")
    parser.add_argument("--phase-s", type=float, default=None,
                        help="seconds per phase (default: --b-samples of B's over the rounds)")
    parser.add_argument("--b-samples", type=int, default=100,
                        help="B's requests per phase over all rounds (p99 = the second slowest "
                             "of 100)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of the three phases (samples pooled per phase)")
    parser.add_argument("--baseline-rounds", type=int, default=2,
                        help="rounds with fairness off (its slowdown is tens of times: fewer do)")
    parser.add_argument("--replica-threads", type=int, default=1,
                        help="torch threads of the replica (the node agent's default is 1)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--slots", type=int, default=4, help="admission slots per replica")
    parser.add_argument("--headroom", type=int, default=2,
                        help="extra slots per replica for tenants under their fair share of "
                             "the slots")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llm_platform.settings")
    os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(48))  # DEBUG is off: one per run
    result = run(args)
    for key in ("victim_slowdown", "victim_slowdown_fairness_off", "victim_p50_slowdown",
                "victim_p50_slowdown_fairness_off", "a_idle_share", "a_idle_share_fairness_off",
                "a_overloads"):
        print(f"{key:30s} {result[key]}")
    print(json.dumps({k: result[k] for k in ("fair", "unfair") if k in result}, indent=1))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
