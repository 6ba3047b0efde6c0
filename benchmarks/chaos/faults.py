"""The faults, injected one at a time while the load runs. Each returns what it did: when it was
injected (`at_s`, seconds since the run's start), how long until the harness had the broken
part back (`restored_after_s`: the harness restarts what was killed, as an operator or a process
supervisor would; Celery beat and a worker run the platform's health checks and billing reaper,
but there is no node agent, so nothing else restarts a replica), and details.

Blocking work (waiting for a restarted process) runs in a thread, so the load goes on.
"""
from __future__ import annotations

import asyncio
import re
import signal
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import httpx

from benchmarks.chaos.counters import CounterLedger, read_activity, read_counters
from benchmarks.chaos.load import Crash, LoadClient
from benchmarks.chaos.stack import Replica, Stack

POISON = {"temperature": 1e-45, "top_p": 1e-45}


@dataclass
class FaultContext:
    stack: Stack
    load: LoadClient
    ledger: CounterLedger
    clock: Callable[[], float]
    redis_pause_s: float = 5.0
    busy_wait_s: float = 15.0
    api_log_offset: int = 0
    background: list[asyncio.Task] = field(default_factory=list)


async def replica_kill(ctx: FaultContext) -> dict:
    """SIGKILL the tritonserver of the busiest replica (most sequences running or waiting, then
    most tokens generated; waiting up to `busy_wait_s` for one with a sequence in flight:
    killing an idle one tests little), its counters read just before; then restart it on the same ports; its registry row is left as it was (ready, same
    address)."""
    replica = await asyncio.to_thread(_busiest, ctx.stack, ctx.busy_wait_s)
    before_activity = await asyncio.to_thread(read_activity, replica)
    before = await asyncio.to_thread(ctx.ledger.close_incarnation, replica)
    at = ctx.clock()
    await asyncio.to_thread(replica.sigkill_server)
    exit_code = replica.proc.popen.returncode if replica.proc.popen else None
    ready_s = await asyncio.to_thread(ctx.stack.restart_replica, replica)
    ctx.ledger.open_restarted(replica)
    return {"at_s": at, "restored_after_s": ctx.clock() - at,
            "details": {"replica": replica.index, "launcher_exit_code": exit_code,
                        "running_or_waiting_at_kill": before_activity,
                        "counters_before_kill": before, "model_load_s": round(ready_s, 2),
                        "restarted_by": "the harness (same command, same ports)"}}


async def poison_request(ctx: FaultContext) -> dict:
    """One request whose sampling parameters are extreme (temperature 1e-45, top_p 1e-45; the
    API has no top_k). Its own outcome is reported here, not among the load's requests, with
    each replica's Triton readiness right after. Nothing is restarted here: see
    `heal_after_poison`, run once the settle time has passed."""
    at = ctx.clock()
    ctx.api_log_offset = _size(ctx.stack.api.log_path)
    record = await ctx.load.send(0, kind="poison", **POISON)
    ready = await asyncio.to_thread(_replicas_ready, ctx.stack)
    return {"at_s": at, "restored_after_s": None,
            "details": {"parameters": POISON, "outcome": record.outcome,
                        "status": record.status, "detail": record.detail,
                        "output_tokens": record.output_tokens,
                        "seconds": round(record.latency, 3),
                        "replicas_ready_after": ready}}


async def heal_after_poison(ctx: FaultContext, fault: dict, window_requests: int) -> dict | None:
    """What an operator does when requests still fail once the settle time is over: restart
    the replicas the API's log names as failed since the poison (every replica when it names
    none). Returns what was done, or None when the last `window_requests` load requests
    completed (nothing to heal). The restart counts against this fault's recovery."""
    recent = [r for r in ctx.load.records
              if r.kind == "load" and r.start >= fault["at_s"] and r.outcome != "in_flight"]
    recent = sorted(recent, key=lambda r: r.start)[-window_requests:]
    if recent and all(r.outcome == "completed" for r in recent):
        return None
    text = _read_from(ctx.stack.api.log_path, ctx.api_log_offset)
    named = set(re.findall(r"replica (\S+) failed", text))
    broken = [r for r in ctx.stack.replicas if r.grpc_address in named] or ctx.stack.replicas
    at = ctx.clock()
    for replica in broken:
        await asyncio.to_thread(ctx.ledger.close_incarnation, replica)
        await asyncio.to_thread(replica.sigkill_server)
    load_s = await asyncio.gather(*(asyncio.to_thread(ctx.stack.restart_replica, r)
                                    for r in broken))
    for replica in broken:
        ctx.ledger.open_restarted(replica)
    return {"at_s": round(at, 2), "replicas": [r.index for r in broken],
            "named_in_api_log": sorted(named), "took_s": round(ctx.clock() - at, 2),
            "model_load_s": [round(s, 2) for s in load_s],
            "why": "load requests were still failing at the end of the settle time"}


def _size(path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path, offset: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


async def api_kill(ctx: FaultContext) -> dict:
    """SIGKILL the API process (daphne) under load and restart it at once, as a supervisor
    would; streams it was serving are cut and retried by their clients (load.py)."""
    crash = Crash(killed_at=ctx.clock())
    ctx.load.crashes.append(crash)
    await asyncio.to_thread(ctx.stack.api.sigkill)
    await asyncio.to_thread(ctx.stack.start_api)
    crash.ready_at = ctx.clock()
    crash.ready.set()
    return {"at_s": crash.killed_at, "restored_after_s": crash.ready_at - crash.killed_at,
            "details": {"restarted_by": "the harness, at once (a supervisor)"}}


async def redis_pause(ctx: FaultContext) -> dict:
    """SIGSTOP redis-server for `redis_pause_s`, then SIGCONT: every client's calls hang."""
    at = ctx.clock()
    ctx.stack.redis.signal_group(signal.SIGSTOP)
    try:
        await asyncio.sleep(ctx.redis_pause_s)
    finally:
        ctx.stack.redis.signal_group(signal.SIGCONT)
    return {"at_s": at, "restored_after_s": ctx.clock() - at,
            "details": {"paused_s": ctx.redis_pause_s}}


async def postgres_restart(ctx: FaultContext) -> dict:
    """A real restart of the PostgreSQL server: fast shutdown (every connection cut, open
    transactions rolled back), then the same server started again on the same port."""
    at = ctx.clock()
    await asyncio.to_thread(ctx.stack.postgres.stop)
    down_at = ctx.clock()
    await asyncio.to_thread(ctx.stack.postgres.start)
    return {"at_s": at, "restored_after_s": ctx.clock() - at,
            "details": {"shutdown_s": round(down_at - at, 3),
                        "start_s": round(ctx.clock() - down_at, 3)}}


async def billing_kill(ctx: FaultContext) -> dict:
    """SIGKILL the billing consumer and restart it (same consumer name: it re-reads the
    entries it had read but not acknowledged)."""
    at = ctx.clock()
    await asyncio.to_thread(ctx.stack.billing.sigkill)
    await asyncio.to_thread(ctx.stack.start_billing)
    return {"at_s": at, "restored_after_s": ctx.clock() - at,
            "details": {"restarted_by": "the harness, at once (a supervisor)"}}


def _busiest(stack: Stack, wait_s: float) -> Replica:
    """The replica with the most sequences running or waiting (then the most tokens
    generated), waiting up to `wait_s` for one that has a sequence at all."""
    def load(replica: Replica) -> tuple[int, int]:
        try:
            return read_activity(replica), read_counters(replica)["generated_tokens"]
        except httpx.HTTPError:
            return -1, -1
    end = time.monotonic() + wait_s
    while True:
        loads = {r.index: load(r) for r in stack.replicas}
        best = max(stack.replicas, key=lambda r: loads[r.index])
        if loads[best.index][0] > 0 or time.monotonic() >= end:
            return best
        time.sleep(0.05)


def _replicas_ready(stack: Stack) -> list[bool]:
    out = []
    for replica in stack.replicas:
        try:
            out.append(httpx.get(replica.ready_url, timeout=5).status_code == 200)
        except httpx.HTTPError:
            out.append(False)
    return out


FAULTS: dict[str, Callable[[FaultContext], Awaitable[dict]]] = {
    "replica_kill": replica_kill,
    "poison_request": poison_request,
    "api_kill": api_kill,
    "redis_pause": redis_pause,
    "postgres_restart": postgres_restart,
    "billing_kill": billing_kill,
}
