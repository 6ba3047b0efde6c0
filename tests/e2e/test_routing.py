"""Routing end to end: daphne in front of three real SmolLM2 replicas (tritonserver + our
engine, small KV pools, one thread each).

- requests sharing a system prompt land on the replica that already holds it, and that
  replica's replica_prefix_cache_hit_tokens_total rises (the others' does not);
- a replica killed (SIGKILL) while it runs requests: every request that had not received its
  first token still completes (retried elsewhere); only started streams end with an error event;
- the health check marks it failed; restarted on the same ports it is marked ready again and
  receives requests again.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from models_registry.models import Model, Replica
from models_registry.services import ensure_model_version, register_replica
from replica.backend.model_parameters import ModelParameters
from replica.replica_process import ReplicaProcess, ReplicaSpec
from inference.replica_signals import parse_metrics
from tenants.services import create_api_key, create_tenant
from scripts.services import free_ports
from tests.e2e.conftest import SMOLLM2_WEIGHTS, daphne_server, platform_env
from tests.support.processes import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# 68 blocks of 16 tokens in whatever dtype the replicas run (48 MiB held 68 in float32 and 136 in
# bfloat16: the test's pools differed between machines).
KV_CACHE_BLOCKS = 68
WORDS = ("billing refund invoice shipment warehouse support ticket priority escalation policy "
         "renewal contract discount catalog product region replica latency budget").split()
SYSTEM = "You are the support assistant of Acme. Rules: " + " ".join(
    WORDS[(i * 7) % len(WORDS)] for i in range(300))  # ~340 tokens


@dataclass
class Outcome:
    status: int
    num_tokens: int  # token events received
    done: bool
    error: bool


@pytest.fixture(scope="module")
def replicas():
    procs = []
    for _ in range(3):
        spec = ReplicaSpec("chat-small", *free_ports(3),
                           parameters=ModelParameters(kv_cache_blocks=KV_CACHE_BLOCKS,
                                                      num_threads=1),
                           drain_grace_s=2.0)
        procs.append(ReplicaProcess(spec))
    try:
        for proc in procs:
            proc.start()
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda p: p.wait_ready(600), procs))
        yield procs
    finally:
        for proc in procs:
            if proc._process is not None:
                proc.stop(grace_s=1.0)


def routing_env() -> dict[str, str]:
    """A short circuit cool-down, so a replica that comes back is probed soon."""
    return platform_env(ROUTER_CIRCUIT_COOLDOWN_SECONDS="2", ROUTER_CIRCUIT_FAILURES="2")


@pytest.fixture(scope="module")
def router_server(django_db_setup, django_db_blocker):
    with daphne_server("daphne-routing", routing_env()) as (url, _):
        yield url


@pytest.fixture
def setup(transactional_db, replicas, router_server):
    tenant = create_tenant("routing", "interactive")
    tenant.requests_per_minute = tenant.tokens_per_minute = 10**7
    tenant.save()
    version = ensure_model_version("chat-small", 1, SMOLLM2_WEIGHTS, tokenizer="weights",
                                   context_length=8192)
    rows = [register_replica(version, p.grpc_url, metrics_address=p.metrics_url.split("/")[2])
            for p in replicas]
    return router_server, create_api_key(tenant).raw_key, version, rows


def routed(base_url: str, model_version_id: int) -> dict[int, int]:
    text = httpx.get(base_url + "/metrics", timeout=10).text
    counts: dict[int, int] = {}
    for rid, value in re.findall(r'^llmp_router_requests_routed_total\{model_version="%d",'
                                 r'replica="(\d+)",[^}]*\} (\d+)$' % model_version_id, text, re.M):
        counts[int(rid)] = counts.get(int(rid), 0) + int(value)
    return counts


def prefix_hits(proc: ReplicaProcess) -> int:
    return parse_metrics(httpx.get(proc.metrics_url, timeout=10).text).prefix_hit_tokens


def active(proc: ReplicaProcess) -> int:
    signals = parse_metrics(httpx.get(proc.metrics_url, timeout=10).text)
    return signals.running_seqs + signals.waiting_seqs


def chat(base_url: str, key: str, user: str, system: str | None = None, max_tokens: int = 4):
    messages = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": user}]
    response = httpx.post(base_url + "/v1/chat/completions", timeout=300,
                          headers={"Authorization": f"Bearer {key}"},
                          json={"model": "chat-small", "messages": messages,
                                "max_tokens": max_tokens, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()


def test_shared_system_prompt_lands_on_the_warm_replica(setup, replicas):
    base_url, key, version, rows = setup
    # The pools are sized in blocks through Triton's model parameters, whatever the dtype.
    assert [parse_metrics(httpx.get(p.metrics_url, timeout=10).text).kv_total_blocks
            for p in replicas] == [KV_CACHE_BLOCKS] * 3
    chat(base_url, key, "What is your refund policy?", SYSTEM)
    first = routed(base_url, version.pk)
    assert sum(first.values()) == 1
    warm_id = next(iter(first))
    warm = replicas[[r.pk for r in rows].index(warm_id)]
    hits_before = {id(p): prefix_hits(p) for p in replicas}
    for i in range(4):
        chat(base_url, key, f"Question {i}: where is my invoice?", SYSTEM)
    assert routed(base_url, version.pk) == {warm_id: 5}
    gained = {id(p): prefix_hits(p) - hits_before[id(p)] for p in replicas}
    # The system prompt is ~340 tokens: each of the 4 requests reuses at least 256 of them.
    assert gained[id(warm)] >= 4 * 256
    assert all(gained[id(p)] == 0 for p in replicas if p is not warm)


async def _stream(http: httpx.AsyncClient, base_url: str, key: str, user: str,
                  started: threading.Event) -> Outcome:
    # long enough that the poll below sees the streams running: at 24 tokens a fast CPU had
    # finished all 9 between two polls of the replicas' metrics ("no replica received a request")
    body = {"model": "chat-small", "stream": True, "max_tokens": 128, "temperature": 0,
            "messages": [{"role": "user", "content": user}]}
    tokens, done, error, event = 0, False, False, None
    async with http.stream("POST", base_url + "/v1/generate", json=body,
                           headers={"Authorization": f"Bearer {key}"}) as response:
        if response.status_code != 200:
            await response.aread()
            return Outcome(response.status_code, 0, False, False)
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "token":
                tokens += 1
                started.set()
            elif line.startswith("data: ") and event == "done":
                done = True
            elif line.startswith("data: ") and event == "error":
                error = bool(json.loads(line[6:]).get("error"))
    return Outcome(200, tokens, done, error)


async def _burst_and_kill(base_url: str, key: str, replicas: list[ReplicaProcess], n: int):
    """Send `n` streams at once; SIGKILL the replica holding the most of them while it runs
    them (some may have started streaming, others not). Returns (outcomes, victim index)."""
    started = threading.Event()
    async with httpx.AsyncClient(timeout=300) as http:
        tasks = [asyncio.create_task(_stream(http, base_url, key, f"Tell story number {i} "
                                             f"about {WORDS[i % len(WORDS)]}.", started))
                 for i in range(n)]
        loads = [0] * len(replicas)
        for _ in range(600):
            loads = [active(p) for p in replicas]
            if sum(loads) >= n // 2:
                break
            # A bounded poll that goes on with whatever load it saw: the kill needs one busy replica.
            await asyncio.sleep(0.05)
        victim = max(range(len(replicas)), key=lambda i: loads[i])
        assert loads[victim] > 0, "no replica received a request"
        os.killpg(replicas[victim].pid, signal.SIGKILL)
        return await asyncio.gather(*tasks), victim


def health_check() -> dict[int, str]:
    """The replica health check in its own process, as Celery beat runs it in production
    (gRPC's asyncio client is bound to the first event loop of a process)."""
    script = ("import django, json; django.setup(); "
              "from fleet.tasks import check_replica_health; "
              "print(json.dumps(check_replica_health()))")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env={**os.environ,
                         **routing_env()}, check=True, capture_output=True, text=True).stdout
    return {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def test_killed_replica_loses_no_unstarted_request_and_comes_back(setup, replicas):
    base_url, key, version, rows = setup
    outcomes, victim_index = asyncio.run(_burst_and_kill(base_url, key, replicas, 9))
    victim, victim_row = replicas[victim_index], rows[victim_index]
    for outcome in outcomes:
        assert outcome.status == 200
        # Completed, or it had started streaming before the replica died (then a clear error).
        assert outcome.done or (outcome.error and outcome.num_tokens > 0), outcome
    assert sum(o.done for o in outcomes) >= 1
    after_kill = routed(base_url, version.pk)
    assert after_kill.get(victim_row.pk, 0) >= 1
    for i in range(3):  # new requests keep succeeding on the survivors
        chat(base_url, key, f"After the crash {i}")
    # The health check (Celery beat in production) marks it failed...
    states = health_check()
    assert states == {r.pk: Replica.State.FAILED if r.pk == victim_row.pk else Replica.State.READY
                      for r in rows}
    victim.stop(grace_s=0.5)  # reap the killed process group, remove its shm regions
    # ...and ready again once it is back on the same ports.
    revived = ReplicaProcess(victim.spec)
    replicas[victim_index] = revived
    revived.start()
    revived.wait_ready(600)
    assert health_check()[victim_row.pk] == Replica.State.READY
    # Round robin (changed at runtime, as from the admin) visits every routable replica in
    # three requests; if the victim's circuit is still open, its half-open probe goes first.
    Model.objects.filter(pk=version.model_id).update(routing_policy="round_robin")
    before = routed(base_url, version.pk).get(victim_row.pk, 0)
    for i in range(3):
        chat(base_url, key, f"Back again {i}: name a colour.")
    assert routed(base_url, version.pk).get(victim_row.pk, 0) > before
