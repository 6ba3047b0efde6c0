"""The chaos benchmark's driver: start the private platform, calibrate, run the load, inject the
faults one after another, drain, count, report. See benchmarks/README.md ("chaos")."""
from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import signal
import statistics
import subprocess
import time
import uuid

import psutil

from benchmarks.chaos.counters import CounterLedger, read_activity
from benchmarks.chaos.faults import FAULTS, FaultContext, heal_after_poison
from benchmarks.chaos.load import LoadClient
from benchmarks.chaos.report import outcome_counts, summarize
from benchmarks.chaos.stack import MODEL, SMOLLM2, Stack
from benchmarks.chaos.usage import billed, dead_letters, wait_drained

SETUP = """
import json
from datetime import timedelta
from django.utils import timezone
from billing.services import set_price
from models_registry.services import ensure_model_version
from tenants.services import create_api_key, create_tenant
version = ensure_model_version(MODEL, 1, WEIGHTS, tokenizer="weights", context_length=8192)
set_price(version, timezone.now() - timedelta(days=1), "0.10", "0.20")
keys = []
for name in NAMES:
    tenant = create_tenant(name, "standard")
    tenant.requests_per_minute = tenant.tokens_per_minute = 10**7  # faults, not quotas
    tenant.save()
    keys.append(create_api_key(tenant).raw_key)
print(json.dumps(keys))
"""

REGISTER = """
from models_registry.models import ModelVersion
from models_registry.services import register_replica
version = ModelVersion.objects.get(model__name=MODEL, version_number=1)
for grpc, metrics in ADDRESSES:
    register_replica(version, grpc, metrics_address=metrics)
"""

METHOD = ("computed_tokens = sum over replica incarnations of (replica_prompt_tokens_total + "
          "replica_generated_tokens_total) at its last read - at its start - its warm-up. A "
          "replica started with the platform is warmed up straight over Triton (as a node agent "
          "does) and then read, before the API process exists; a replica restarted under load "
          "starts from zero (a fresh process) and its warm-up's own count (its final response) "
          "is subtracted; each is read again just before the harness SIGKILLs it and at the end "
          "once every replica is idle. Warm-ups never go through the API, so they are not "
          "billed; health checks and the reaper's usage queries compute no token. "
          "billed_tokens = sum of usage rows' input_tokens + output_tokens once the billing "
          "consumer drained and no usage row is pending any more (the reaper, run by Celery "
          "beat, finalised the rows of requests whose API process was killed). Both include the "
          "API warm-up, calibration, poison and retried requests (all go through the API).")


def log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


def setup_platform(stack: Stack, args) -> list[str]:
    stack.start_services()
    log(f"PostgreSQL :{stack.postgres.port} (db {stack.database}), Redis :{stack.redis_port}; "
        f"logs in {stack.log_dir}")
    stack.manage("migrate", "--noinput")
    names = [f"chaos-{stack.run_id}-t{i}" for i in range(args.tenants)]
    script = f"MODEL = {MODEL!r}\nWEIGHTS = {SMOLLM2!r}\nNAMES = {names!r}\n" + SETUP
    keys = json.loads(stack.manage("shell", "-c", script, capture=True).strip().splitlines()[-1])
    replica_args = ["--num-threads", str(args.replica_threads)]
    stack.start_replicas(args.replicas, replica_args)
    addresses = [(r.grpc_address, r.metrics_address) for r in stack.replicas]
    stack.manage("shell", "-c", f"MODEL = {MODEL!r}\nADDRESSES = {addresses!r}\n" + REGISTER)
    log(f"{args.replicas} replicas ready and registered")
    stack.start_api()
    stack.start_billing()
    stack.start_celery()
    log(f"API at {stack.base_url}, billing consumer, Celery worker and beat running")
    return keys


async def calibrate(load: LoadClient, args) -> float:
    """Seconds one request takes alone (after two warm-ups)."""
    for i in range(2):
        record = await load.send(i % args.tenants, kind="warmup")
        if record.outcome != "completed":
            raise RuntimeError(f"warm-up request failed: {record}")
    times = []
    for i in range(3):
        record = await load.send(i % args.tenants, kind="calibrate")
        if record.outcome != "completed":
            raise RuntimeError(f"calibration request failed: {record}")
        times.append(record.latency)
    return statistics.median(times)


async def progress(load: LoadClient, every_s: float, status: dict) -> None:
    while True:
        await asyncio.sleep(every_s)
        records = [r for r in load.records if r.kind == "load"]
        counts = outcome_counts(records)
        in_flight = sum(r.outcome == "in_flight" for r in records)
        log(f"t={load.clock():6.1f}s sent {len(records)} completed {counts['completed']} "
            f"failed {counts['failed_with_error']} cut {counts['cut_by_crash']} "
            f"refused {counts['refused_api_down']} lost {counts['lost']} "
            f"in flight {in_flight} | {status.get('phase', '')}")


async def drive(stack: Stack, ledger: CounterLedger, keys: list[str], args) -> dict:
    t0 = time.monotonic()
    load = LoadClient(stack.base_url, keys, args.max_tokens, args.hang_bound_s,
                      args.retry_timeout_s, lambda: time.monotonic() - t0,
                      run_tag=stack.run_id)
    service_s = await calibrate(load, args)
    capacity = min(args.replicas, os.cpu_count() or 1) / service_s
    rate = args.rate or args.load * capacity
    log(f"one request alone: {service_s:.2f} s -> capacity ~{capacity:.2f} req/s; "
        f"load {rate:.2f} req/s over {args.tenants} tenants")
    stop = asyncio.Event()
    tasks: list[asyncio.Task] = []
    status = {"phase": "baseline"}

    async def generate() -> None:
        start, i = load.clock(), 0
        while not stop.is_set():
            delay = start + i / rate - load.clock()
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                    return
                except asyncio.TimeoutError:
                    pass
            tasks.append(asyncio.create_task(load.send(i % args.tenants)))
            i += 1

    ctx = FaultContext(stack, load, ledger, load.clock, redis_pause_s=args.redis_pause_s)
    reporter = asyncio.create_task(progress(load, args.progress_s, status))
    generator = asyncio.create_task(generate())
    load_start = load.clock()
    await asyncio.sleep(args.baseline_s)
    faults = []
    for name in args.faults:
        status["phase"] = f"fault {name}"
        log(f"injecting {name}")
        started = load.clock()
        result = await FAULTS[name](ctx)
        result["fault"] = name
        faults.append(result)
        restored = result.get("restored_after_s")
        log(f"{name} injected at t={result['at_s']:.1f}s"
            + (f", restored by the harness after {restored:.1f} s" if restored is not None else "")
            + (f": {result['details'].get('outcome')} {result['details'].get('detail', '')}"
               if name == "poison_request" else ""))
        status["phase"] = f"settling after {name}"
        # At least --settle-s from the injection, and --min-settle-s after the harness had
        # the part back (a replica's restart can take longer than the settle time).
        now = load.clock()
        await asyncio.sleep(max(started + args.settle_s, now + args.min_settle_s) - now)
        if name == "poison_request":
            healed = await heal_after_poison(ctx, result, args.window_requests)
            if healed is not None:
                result["details"]["operator_restart"] = healed
                log(f"requests still failing after the poison: the harness restarted replicas "
                    f"{healed['replicas']} ({healed['took_s']:.1f} s)")
                await asyncio.sleep(args.min_settle_s)
    load_end = load.clock()
    stop.set()
    await generator
    status["phase"] = "waiting for the last requests (and retries of cut streams)"
    await asyncio.gather(*tasks)
    reporter.cancel()
    await load.aclose()
    summary = summarize(load.records, faults, load_end, args.window_requests,
                        args.target_recovery_s, args.slow_factor)
    summary["load"] = {"rate_per_s": round(rate, 3), "single_request_s": round(service_s, 3),
                       "capacity_estimate_per_s": round(capacity, 3),
                       "load_seconds": round(load_end - load_start, 1),
                       "recovery_window_requests": args.window_requests}
    return summary


def wait_replicas_idle(stack: Stack, deadline_s: float = 120.0) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if all(read_activity(r) == 0 for r in stack.replicas):
                return True
        except Exception:  # noqa: BLE001 - a dead replica reads as busy until the deadline
            pass
        time.sleep(0.5)
    return False


def alive(pids: dict[str, list[int]]) -> list[int]:
    out = []
    for pid in (p for group in pids.values() for p in group):
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            pass
    return out


def machine() -> dict:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        text = ""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    return {"cpu": fields.get("Model name", "").strip(), "cpu_count": os.cpu_count(),
            "avx512_bf16": "avx512_bf16" in flags, "avx2": "avx2" in flags}


def run(args) -> dict:
    stack = Stack.create(uuid.uuid4().hex[:8])
    atexit.register(stack.stop)
    ledger = CounterLedger()
    started = time.monotonic()
    load_average = {"at_start": [round(x, 2) for x in os.getloadavg()]}
    try:
        keys = setup_platform(stack, args)
        for replica in stack.replicas:
            ledger.open_incarnation(replica)
        summary = asyncio.run(drive(stack, ledger, keys, args))
        idle = wait_replicas_idle(stack)
        ledger.close_all(stack.replicas)
        load_average["at_end_of_load"] = [round(x, 2) for x in os.getloadavg()]
        log("load done; waiting for the billing consumer to drain and the reaper to finalise "
            "every pending usage row")
        stream_key = f"{stack.env['REDIS_KEY_PREFIX']}billing:usage"
        drain = wait_drained(stack.redis_url, stream_key, stack.var_dir / "billing-outbox",
                             stack.database_url, args.drain_deadline_s)
        usage = billed(stack.database_url)
        dead = dead_letters(stack.redis_url, stream_key)
    finally:
        stack.stop()
    still_alive = alive(stack.started_pids())
    computed = ledger.totals()
    computed_tokens = computed["prompt_tokens"] + computed["generated_tokens"]
    billed_tokens = usage["input_tokens"] + usage["output_tokens"]
    recoveries = summary["recovery_s"]
    return {
        "benchmark": "chaos",
        "mode": "smoke" if args.smoke else "full",
        "run_id": stack.run_id,
        **{k: summary[k] for k in ("sent", "accepted", "completed", "failed_with_error",
                                   "cut_by_crash", "lost", "refused_api_down")},
        "computed_tokens": computed_tokens,
        "billed_tokens": billed_tokens,
        "billed_minus_computed": billed_tokens - computed_tokens,
        # Prompt tokens served from a replica's prefix cache are billed (input_tokens includes
        # them) and counted in replica_prompt_tokens_total alike (counters.py); this is what
        # was billed for prompt tokens actually run through the model.
        "billed_uncached_tokens": billed_tokens - usage["cached_tokens"],
        "recovery_s": recoveries,
        "targets": {"lost": 0, "billed_tokens": "== computed_tokens",
                    "recovery_s": f"<= {args.target_recovery_s:g} for every fault"},
        "targets_met": {
            "lost_zero": summary["lost"] == 0,
            "billed_equals_computed": billed_tokens == computed_tokens,
            "every_fault_recovered": all(v is not None and v <= args.target_recovery_s
                                         for v in recoveries.values()),
        },
        "cut_by_crash_retries": summary["cut_by_crash_retries"],
        "faults": summary["faults"],
        "computed": {"method": METHOD, **computed, "complete": ledger.complete,
                     "replicas_idle_at_end": idle, "incarnations": ledger.as_json()},
        "billed": usage,
        "billing_drain": drain,
        "billing_dead_letters": dead,
        "baseline_p50_latency_s": summary["baseline_p50_latency_s"],
        "load": summary["load"],
        "failed_with_error_kinds": summary["failed_with_error_kinds"],
        "lost_examples": summary["lost_examples"],
        "cut_by_crash_retry_details": summary["cut_by_crash_retry_details"],
        "timeline": summary["timeline"],
        "harness": ("The harness restarts what it kills, as an operator or a process supervisor "
                    "would: a replica's tritonserver is SIGKILLed and `python -m replica.launch` "
                    "started again on the same ports (its registry row untouched) with the "
                    "replica access token in its environment and warmed up, as a node agent "
                    "does; daphne and the billing consumer are restarted at once; PostgreSQL is "
                    "a private server stopped (fast shutdown) and started again; Redis is "
                    "SIGSTOPped then SIGCONTed. Celery beat and one worker run the platform's "
                    "schedule as in production (replica health checks every 10 s, the billing "
                    "reaper every 30 s, roll-ups, ...); no node agent runs, so no replica is "
                    "replaced by the fleet (the harness restarts it)."),
        "load_average": load_average,
        "processes_started": stack.started_pids(),
        "processes_alive_after_stop": still_alive,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": machine(),
        "wall_s": round(time.monotonic() - started, 1),
    }


def _raise_exit(signum, _frame) -> None:
    raise SystemExit(128 + signum)


SMOKE = {"faults": ["api_kill", "billing_kill"], "baseline_s": 8.0, "settle_s": 15.0, "min_settle_s": 8.0,
         "window_requests": 3, "retry_timeout_s": 15.0, "hang_bound_s": 60.0,
         "drain_deadline_s": 150.0, "tenants": 3}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos",
                                     description="Faults injected under streaming load.")
    parser.add_argument("--out", default=None, help="write the JSON here")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny run for CI: " + ", ".join(f"{k}={v}" for k, v in SMOKE.items()))
    parser.add_argument("--faults", nargs="+", choices=list(FAULTS), default=list(FAULTS))
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--replica-threads", type=int, default=1,
                        help="torch threads per replica (the node agent's default is 1)")
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--load", type=float, default=0.5,
                        help="share of the estimated capacity (replicas / one request's time)")
    parser.add_argument("--rate", type=float, default=0.0, help="requests/s (0: from --load)")
    parser.add_argument("--baseline-s", type=float, default=30.0,
                        help="load before the first fault (the baseline latency)")
    parser.add_argument("--settle-s", type=float, default=45.0,
                        help="from one fault's injection to the next")
    parser.add_argument("--min-settle-s", type=float, default=20.0,
                        help="at least this long after the harness restored the part")
    parser.add_argument("--window-requests", type=int, default=5,
                        help="consecutive normal requests that mark a recovery")
    parser.add_argument("--slow-factor", type=float, default=3.0,
                        help="a normal run's median latency is at most this x the baseline + 1 s")
    parser.add_argument("--target-recovery-s", type=float, default=30.0)
    parser.add_argument("--hang-bound-s", type=float, default=90.0,
                        help="a request not ended after this long is lost")
    parser.add_argument("--retry-timeout-s", type=float, default=60.0,
                        help="how long a cut stream's client retries through 409s")
    parser.add_argument("--redis-pause-s", type=float, default=5.0)
    parser.add_argument("--drain-deadline-s", type=float, default=180.0)
    parser.add_argument("--progress-s", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.smoke:
        defaults = parser.parse_args([])
        for key, value in SMOKE.items():  # what the command line set itself wins
            if getattr(args, key) == getattr(defaults, key):
                setattr(args, key, value)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_exit)
    result = run(args)
    headline = {k: result[k] for k in ("accepted", "completed", "failed_with_error",
                                       "cut_by_crash", "lost", "computed_tokens",
                                       "billed_tokens", "recovery_s", "cut_by_crash_retries",
                                       "targets_met")}
    print(json.dumps(headline, indent=1), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)
        log(f"wrote {args.out}")
