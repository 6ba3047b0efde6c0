"""The node agent: registers its node, heartbeats, and runs the replicas placed on it.

It lives inside a Celery worker that consumes the node's own queue `node.<name>` (see
agent_tasks.py and `manage.py nodeagent`). Each replica is a `python -m replica.launch` child:
- start: pick ports, record the addresses, spawn the launcher (it dies with the agent: a lost
  agent must not leave servers nobody manages);
- a watcher thread per child: once the launcher prints `replica ready:` it sends one warm-up
  request and only then moves the replica loading -> ready (with its measured load time); if the
  process dies it records failed (or stopped, when it was draining); when the registry says the
  replica is failed or draining (health check, lost node, autoscaler) it stops the child;
- stop: SIGTERM the launcher, which drains (no new requests; in-flight streams finish within
  the grace period) and stops tritonserver; the watcher then records stopped.
Popen is called on the thread that handles the task (PR_SET_PDEATHSIG fires when the spawning
*thread* exits), never on a watcher thread.

Access (replica/access.py, docs/security.md): a replica listens on the agent's bind address only
(NODE_BIND_ADDRESS; default NODE_ADDRESS when that is an IP address, else loopback) and refuses
calls without the replica access token, which the launcher gets in its environment (never on a
command line); platform secrets are removed from the replica's environment.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable

from django.db import close_old_connections, connection

from common.parent_death import dies_with_parent
from fleet.gpus import Gpu, discover as discover_gpus
from fleet.lifecycle import transition
from models_registry.models import Replica
from fleet.nodes import heartbeat, register_node
from replica.weights_cache import cache_dir as weights_cache_dir, cached_path, check_remote
from replica.weights_cache import fetch as fetch_weights, is_remote
from replica.access import LOOPBACK, TOKEN_ENV, is_loopback

# Platform secrets a replica has no use for: its model code handles untrusted prompts.
_WITHHELD_FROM_REPLICAS = ("SECRET_KEY", "REPLICA_SECRET", "METRICS_TOKEN", "DATABASE_URL")

logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[1]
_READY_LINE = re.compile(r"replica ready: .*?pid=(\d+)")


@dataclass(frozen=True)
class AgentConfig:
    name: str
    zone: str = ""
    address: str = "127.0.0.1"  # where the platform reaches this node's replicas
    bind_address: str = LOOPBACK  # where the replicas listen
    access_token: str = field(default="", repr=False)  # replicas refuse calls without it
    cpu_slots: int = 2
    memory_mib: int = 4096
    accelerator: str = "cpu"
    heartbeat_s: float = 2.0
    replica_threads: int = 0  # torch threads per replica; 0: the CPU slots reserved for it
    drain_grace_s: float = 30.0
    log_dir: Path = REPO / "var" / "logs" / "agents"
    port_range: tuple[int, int] | None = None  # replicas' ports (None: any free port)
    gpus: tuple[Gpu, ...] = ()  # discovered (fleet/gpus.py); none: a CPU node

    @classmethod
    def from_env(cls, env: dict[str, str], access_token: str = "",
                 gpus: list[Gpu] | None = None) -> "AgentConfig":
        """`gpus`: the node's GPUs (default: discovered now)."""
        gpus = discover_gpus(env) if gpus is None else gpus
        address = env.get("NODE_ADDRESS") or LOOPBACK
        bind_address = env.get("NODE_BIND_ADDRESS") or default_bind_address(address)
        if is_loopback(address) and not is_loopback(bind_address):
            raise ValueError(f"replicas listen on {bind_address}, but NODE_ADDRESS (where the "
                             "platform reaches them) is loopback: set NODE_ADDRESS to the address "
                             "other hosts reach this node at")
        return cls(
            name=env["NODE_NAME"],
            zone=env.get("NODE_ZONE", ""),
            address=address,
            bind_address=bind_address,
            access_token=access_token,
            cpu_slots=int(env.get("NODE_CPU_SLOTS", "2")),
            memory_mib=int(env.get("NODE_MEMORY_MIB", "4096")),
            accelerator=env.get("NODE_ACCELERATOR") or ("gpu" if gpus else "cpu"),
            heartbeat_s=float(env.get("NODE_HEARTBEAT_SECONDS", "2")),
            replica_threads=int(env.get("NODE_REPLICA_THREADS", "0")),
            drain_grace_s=float(env.get("NODE_DRAIN_GRACE_SECONDS", "30")),
            log_dir=Path(env.get("NODE_LOG_DIR", str(cls.log_dir))),
            port_range=parse_port_range(env.get("REPLICA_PORT_RANGE", "")),
            gpus=tuple(gpus),
        )


@dataclass
class Child:
    replica_id: int
    popen: subprocess.Popen
    log_path: Path
    model_name: str
    grpc_address: str
    started: float
    ports: tuple[int, ...] = ()
    stopping: bool = False
    ready: bool = False
    thread: threading.Thread | None = field(default=None, repr=False)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def default_bind_address(address: str) -> str:
    """The node's address when it is an IP address (the replicas listen there only), else
    loopback: a host name may resolve elsewhere, so NODE_BIND_ADDRESS must say it."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return LOOPBACK


def replica_environment(base: dict[str, str], access_token: str) -> dict[str, str]:
    """The launcher's environment: the access token in, platform secrets out."""
    env = {k: v for k, v in base.items() if k not in _WITHHELD_FROM_REPLICAS and k != TOKEN_ENV}
    if access_token:
        env[TOKEN_ENV] = access_token
    return env


def parse_port_range(text: str) -> tuple[int, int] | None:
    """`REPLICA_PORT_RANGE` ("20000-20999") as (low, high); '' -> None (any free port)."""
    if not text.strip():
        return None
    low, sep, high = text.strip().partition("-")
    try:
        bounds = (int(low), int(high or low))
    except ValueError:
        bounds = (0, -1)
    if not sep or not 1 <= bounds[0] <= bounds[1] <= 65535:
        raise ValueError(f"REPLICA_PORT_RANGE must be LOW-HIGH within 1-65535, not {text!r}")
    return bounds


def _bindable(address: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((address, port))
        except OSError:
            return False
        return True


def pick_ports(count: int, bind_address: str, port_range: tuple[int, int] | None,
               taken: set[int], start: int | None = None) -> list[int]:
    """`count` ports its replica can listen on: from `port_range` (from `start`, wrapping),
    skipping `taken` (this agent's other replicas) and ports in use on the bind address or
    loopback (Triton's HTTP port); without a range, ports the kernel picks on the bind address."""
    addresses = {bind_address, LOOPBACK}
    if port_range is None:
        ports: list[int] = []
        while len(ports) < count:
            with socket.socket() as sock:
                sock.bind((bind_address, 0))
                port = sock.getsockname()[1]
            if port not in taken and port not in ports and all(_bindable(a, port) for a in addresses):
                ports.append(port)
        return ports
    low, high = port_range
    size = high - low + 1
    first = low if start is None else low + (start - low) % size
    ports = []
    for i in range(size):
        port = low + (first - low + i) % size
        if port not in taken and all(_bindable(a, port) for a in addresses):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise OSError(f"no {count} free ports left in {low}-{high} on {bind_address}: widen "
                  "REPLICA_PORT_RANGE or run fewer replicas on this node")


async def _warm_up(grpc_address: str, model_name: str, access_token: str) -> None:
    """One short generation through the platform's own client: the replica answers for real."""
    from inference.triton_client import warm_up  # noqa: PLC0415

    await warm_up(grpc_address, model_name, access_token)


class NodeAgent:
    def __init__(self, config: AgentConfig, *, now: Callable[[], datetime],
                 clock: Callable[[], float] = time.monotonic,
                 warm_up: Callable[[str, str], None] | None = None):
        self.config = config
        self._now = now  # wall clock for the registry
        self._clock = clock  # monotonic, for load times
        self._warm_up = warm_up or (lambda address, model: asyncio.run(
            _warm_up(address, model, config.access_token)))
        self._children: dict[int, Child] = {}
        self._downloading: set[int] = set()  # replicas whose https weights are downloading
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="agent-heartbeat",
                                                  daemon=True)

    # ---- node ---------------------------------------------------------------------------------

    def register(self) -> None:
        c = self.config
        register_node(c.name, zone=c.zone, address=c.address, cpu_slots=c.cpu_slots,
                      memory_mib=c.memory_mib, accelerator=c.accelerator, now=self._now(),
                      gpus=[g.as_dict() for g in c.gpus])
        logger.info("node %s registered (zone %s, %d slots, %d MiB, %d GPUs)", c.name, c.zone,
                    c.cpu_slots, c.memory_mib, len(c.gpus))

    def start(self) -> None:
        self.register()
        self._heartbeat_thread.start()

    def _heartbeat_loop(self) -> None:
        try:
            while not self._stopped.wait(self.config.heartbeat_s):
                try:
                    close_old_connections()
                    if not heartbeat(self.config.name, self._now()):
                        logger.warning("node %s was presumed lost; registering again", self.config.name)
                        self.register()
                except Exception:  # noqa: BLE001 - a database hiccup must not end the heartbeats
                    logger.exception("heartbeat failed")
        finally:
            connection.close()

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Drain and stop every child (the worker is stopping)."""
        self._stopped.set()
        with self._lock:
            children = list(self._children.values())
        for child in children:
            try:
                transition(child.replica_id, Replica.State.DRAINING, "node agent stopping", self._now(),
                           only_from=(Replica.State.LOADING, Replica.State.READY))
            except Exception:  # noqa: BLE001
                logger.exception("could not mark replica %s draining", child.replica_id)
            self._terminate(child)
        deadline = time.monotonic() + (timeout_s or self.config.drain_grace_s + 30)
        for child in children:
            if child.thread is not None:
                child.thread.join(max(0.0, deadline - time.monotonic()))

    # ---- replicas -----------------------------------------------------------------------------

    def start_replica(self, replica_id: int) -> bool:
        """Launch a loading replica of this node. Weights over https that are not cached yet are
        downloaded on a thread of their own (the replica stays loading; the launch follows), so
        this task's thread is free for the next start or stop at once."""
        replica = Replica.objects.select_related("model_version__model").filter(
            pk=replica_id, node__name=self.config.name).first()
        if replica is None or replica.state != Replica.State.LOADING:
            logger.info("replica %s: not loading on %s; nothing to start", replica_id, self.config.name)
            return False
        with self._lock:
            if replica_id in self._children or replica_id in self._downloading:
                return False
        from inference.tokenization import resolve_weights  # noqa: PLC0415

        version = replica.model_version
        try:
            if is_remote(version.weights_uri):  # once per node, verified (replica/weights_cache.py)
                check_remote(version.weights_uri, version.weights_sha256)
                cached = cached_path(version.weights_uri, version.weights_sha256, weights_cache_dir())
                if not cached.is_file():
                    with self._lock:
                        self._downloading.add(replica_id)
                    threading.Thread(target=self._download_then_launch, args=(replica,), daemon=True,
                                     name=f"replica-{replica_id}-weights").start()
                    return True
                weights = str(cached)
            else:
                weights = str(resolve_weights(version.weights_uri))
        except (OSError, ValueError) as exc:
            transition(replica_id, Replica.State.FAILED, f"weights unavailable: {exc}"[:300], self._now())
            return False
        return self._launch(replica, weights)

    def _download_then_launch(self, replica: Replica) -> None:
        replica_id, version = replica.pk, replica.model_version
        try:
            logger.info("replica %s: downloading %s", replica_id, version.weights_uri)
            try:
                weights = str(fetch_weights(version.weights_uri, version.weights_sha256))
            except (OSError, ValueError) as exc:
                transition(replica_id, Replica.State.FAILED, f"weights unavailable: {exc}"[:300], self._now())
                return
            state = Replica.objects.filter(pk=replica_id).values_list("state", flat=True).first()
            if state != Replica.State.LOADING or self._stopped.is_set():  # stopped while downloading
                transition(replica_id, Replica.State.STOPPED, "stopped while its weights downloaded",
                           self._now(), only_from=(Replica.State.DRAINING, Replica.State.FAILED))
                return
            self._launch(replica, weights)
        except Exception as exc:  # noqa: BLE001 - the replica must not stay loading forever
            logger.exception("replica %s: start after download failed", replica_id)
            transition(replica_id, Replica.State.FAILED, f"start failed: {exc}"[:300], self._now())
        finally:
            with self._lock:
                self._downloading.discard(replica_id)
            connection.close()

    def _launch(self, replica: Replica, weights: str) -> bool:
        replica_id, version = replica.pk, replica.model_version
        try:
            with self._lock:
                taken = {port for c in self._children.values() for port in c.ports}
            grpc_port, http_port, metrics_port = pick_ports(
                3, self.config.bind_address, self.config.port_range, taken,
                start=random.randrange(65536))
        except OSError as exc:
            transition(replica_id, Replica.State.FAILED, str(exc)[:300], self._now())
            return False
        address = self.config.address
        Replica.objects.filter(pk=replica_id).update(
            grpc_address=f"{address}:{grpc_port}", metrics_address=f"{address}:{metrics_port}")
        self.config.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.config.log_dir / f"{self.config.name}-replica-{replica_id}.log"
        command = launch_command(version.model.name, weights, version.quantization,
                                 (grpc_port, http_port, metrics_port),
                                 replica_threads(self.config.replica_threads, replica.cpu_slots),
                                 self.config.drain_grace_s, self.config.bind_address)
        extra_args, extra_env = replica_launch(replica.gpu_indices or [], version.kv_cache_mib,
                                               version.tensor_parallel_degree)
        command += extra_args
        env = {**replica_environment(dict(os.environ), self.config.access_token), **extra_env}
        with open(log_path, "ab") as log:
            # The launcher gets SIGTERM if the agent dies (it drains and stops its server).
            popen = subprocess.Popen(dies_with_parent(command), cwd=REPO, stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        child = Child(replica_id, popen, log_path, version.model.name, f"{address}:{grpc_port}",
                      self._clock(), ports=(grpc_port, http_port, metrics_port))
        child.thread = threading.Thread(target=self._watch, args=(child,), daemon=True,
                                        name=f"replica-{replica_id}")
        with self._lock:
            self._children[replica_id] = child
        child.thread.start()
        logger.info("replica %s: launching %s on ports %d/%d/%d", replica_id, version,
                    grpc_port, http_port, metrics_port)
        return True

    def stop_replica(self, replica_id: int) -> None:
        with self._lock:
            child = self._children.get(replica_id)
        if child is None:
            transition(replica_id, Replica.State.STOPPED, f"not running on {self.config.name}",
                       self._now(), only_from=(Replica.State.DRAINING, Replica.State.FAILED))
            return
        self._terminate(child)

    def replica_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._children)

    def _terminate(self, child: Child) -> None:
        if not child.stopping and child.popen.poll() is None:
            child.stopping = True
            child.popen.send_signal(signal.SIGTERM)  # the launcher drains, then stops its server

    def _watch(self, child: Child) -> None:
        try:
            self._watch_until_exit(child)
        except Exception:  # noqa: BLE001
            logger.exception("watcher of replica %s failed", child.replica_id)
            self._terminate(child)
        finally:
            with self._lock:
                self._children.pop(child.replica_id, None)
            connection.close()

    def _watch_until_exit(self, child: Child) -> None:
        next_check = 0.0
        while True:
            code = child.popen.poll()
            if code is not None:
                self._report_exit(child, code)
                return
            if not child.ready and not child.stopping:
                match = _READY_LINE.search(child.log_text())
                if match:
                    self._promote(child, int(match.group(1)))
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + 1.0
                state = Replica.objects.filter(pk=child.replica_id).values_list("state", flat=True).first()
                if state in (None, Replica.State.FAILED, Replica.State.STOPPED, Replica.State.DRAINING):
                    self._terminate(child)
            time.sleep(0.2)

    def _promote(self, child: Child, server_pid: int) -> None:
        Replica.objects.filter(pk=child.replica_id).update(server_pid=server_pid)
        try:
            self._warm_up(child.grpc_address, child.model_name)
        except Exception as exc:  # noqa: BLE001 - any failure: the replica does not serve
            transition(child.replica_id, Replica.State.FAILED, f"warm-up request failed: {exc}"[:300],
                       self._now(), only_from=(Replica.State.LOADING,))
            self._terminate(child)
            return
        load_s = self._clock() - child.started
        child.ready = True
        transition(child.replica_id, Replica.State.READY,
                   f"Triton ready and warm-up answered after {load_s:.1f}s", self._now(),
                   only_from=(Replica.State.LOADING,), load_seconds=load_s,
                   last_heartbeat=self._now())

    def _report_exit(self, child: Child, code: int) -> None:
        now = self._now()
        state = Replica.objects.filter(pk=child.replica_id).values_list("state", flat=True).first()
        if state == Replica.State.DRAINING:
            reason = ("drained: in-flight streams finished" if code == 0
                      else f"stopped: drain grace expired or the server failed (exit {code})")
            transition(child.replica_id, Replica.State.STOPPED, reason, now)
        elif state in (Replica.State.LOADING, Replica.State.READY):
            tail = child.log_text().strip().splitlines()[-1:] or [""]
            transition(child.replica_id, Replica.State.FAILED,
                       f"process exited with code {code}: {tail[0]}"[:300], now)
        elif state == Replica.State.FAILED:
            transition(child.replica_id, Replica.State.STOPPED, f"process ended (exit {code})", now)


def replica_threads(configured: int, cpu_slots: int) -> int:
    """Torch threads for a replica: the node's explicit setting, else one per CPU slot that
    placement reserved for it (at least one)."""
    return configured if configured > 0 else max(1, cpu_slots)


def replica_launch(gpu_indices: list[int], kv_cache_mib: int,
                   tensor_parallel_degree: int) -> tuple[list[str], dict[str, str]]:
    """What a replica's placement adds to its launch: the arguments (the engine on CUDA, the
    KV cache the version asks for, its tensor-parallel degree) and the environment (the GPUs it
    holds, as CUDA_VISIBLE_DEVICES). Nothing for a CPU replica of an undeclared version."""
    args: list[str] = []
    env: dict[str, str] = {}
    if gpu_indices:
        args += ["--device", "cuda"]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_indices)
    if kv_cache_mib > 0:
        args += ["--kv-cache-bytes", str(kv_cache_mib * 2**20)]
    if tensor_parallel_degree > 1:
        args += ["--tensor-parallel-degree", str(tensor_parallel_degree)]
    return args, env


def launch_command(model_name: str, weights: str, quantization: str,
                   ports: tuple[int, int, int], num_threads: int,
                   drain_grace_s: float, bind_address: str = LOOPBACK) -> list[str]:
    """The `replica.launch` command line of one replica. `quantization` is the version's
    stored value, passed as is (replica.launch maps '' and GGUF type names to none and refuses
    what the engine cannot run). It holds no secret: it is visible in `ps`."""
    grpc_port, http_port, metrics_port = ports
    return [sys.executable, "-m", "replica.launch", "--model", model_name,
            "--weights", weights, "--quantization", quantization or "none",
            "--grpc-port", str(grpc_port), "--http-port", str(http_port),
            "--metrics-port", str(metrics_port), "--num-threads", str(num_threads),
            "--drain-grace-s", str(drain_grace_s), "--bind-address", bind_address]
