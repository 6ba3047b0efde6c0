"""ReplicaProcess: one tritonserver serving one model with our engine, started and stopped safely.

Lifecycle: `start()` (write the repository, spawn the server in its own process group) ->
`wait_ready()` -> serve (`engine_dead_reason()` says when the model's engine loop died: the
server then serves nothing and should be stopped) -> `stop()`: drain (the model refuses new work and ends in-flight streams
within the grace period), SIGTERM the server, SIGKILL its process group if it outlives the
timeout, and remove its /dev/shm regions. Used by `python -m replica.launch`, tests and the
platform's fleet code.

Access (replica/access.py): gRPC and metrics listen on `bind_address` only (loopback unless
told otherwise), HTTP (readiness, tests) on loopback always; with an `access_token` every
protocol group but health refuses calls without it. No token and a non-loopback bind address
is refused at start.
"""
from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from replica.access import LOOPBACK, TOKEN_ENV, check_bind, http_headers, server_flags
from replica.backend.drain_watcher import drained_marker
from replica.backend.model_parameters import ModelParameters
from replica.repository_writer import write_model_repository
from replica.triton_install import TritonInstall

_REPO_ROOT = Path(__file__).resolve().parent.parent  # holds the `replica` package for the stub


class LaunchError(RuntimeError):
    """The replica could not be started or did not become ready."""


@dataclass(frozen=True)
class ReplicaSpec:
    model_name: str
    grpc_port: int
    http_port: int
    metrics_port: int
    parameters: ModelParameters = field(default_factory=ModelParameters)
    workdir: Path | None = None  # None: a temporary directory, removed after a clean stop
    drain_grace_s: float = 30.0
    bind_address: str = LOOPBACK  # gRPC and metrics listen here only; HTTP on loopback always
    access_token: str = field(default="", repr=False)  # "": unrestricted (loopback binds only)

    @property
    def host(self) -> str:
        """Where this host reaches the server's gRPC and metrics ports."""
        return LOOPBACK if self.bind_address in ("0.0.0.0", "::", "[::]") else self.bind_address


class ReplicaProcess:
    def __init__(
        self,
        spec: ReplicaSpec,
        *,
        install: TritonInstall | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.spec = spec
        self._install = install
        self._clock = clock
        self._sleep = sleep
        self._process: subprocess.Popen | None = None
        self._owns_workdir = spec.workdir is None
        self.workdir: Path | None = spec.workdir
        self.shm_prefix = f"replica{os.getpid()}_{secrets.token_hex(4)}_"
        self.weights_path = ""
        self.killed = False
        self._drained = False

    # ---- paths and addresses ------------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        return self._dir / "tritonserver.log"

    @property
    def drain_path(self) -> Path:
        return self._dir / "drain"

    @property
    def engine_dead_path(self) -> Path:
        return self._dir / "engine-dead"

    @property
    def fault_path(self) -> Path:
        return self._dir / "fault"

    @property
    def grpc_url(self) -> str:
        return f"{self.spec.host}:{self.spec.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{LOOPBACK}:{self.spec.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def _dir(self) -> Path:
        if self.workdir is None:
            raise RuntimeError("the replica has not been started")
        return self.workdir

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        if self._process is not None:
            raise RuntimeError("already started")
        check_bind(self.spec.bind_address, self.spec.access_token)
        self.weights_path = _resolve_weights(self.spec.parameters.weights)
        install = self._install or TritonInstall.from_wheel()
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"replica-{self.spec.model_name}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.drain_path.unlink(missing_ok=True)
        Path(drained_marker(str(self.drain_path))).unlink(missing_ok=True)
        self.engine_dead_path.unlink(missing_ok=True)
        self.fault_path.unlink(missing_ok=True)
        parameters = ModelParameters(
            **{
                **self.spec.parameters.__dict__,
                "weights": self.weights_path,
                "drain_file": str(self.drain_path),
                "drain_grace_s": self.spec.drain_grace_s,
                "engine_dead_file": str(self.engine_dead_path),
                "fault_file": str(self.fault_path),
            }
        )
        repository = write_model_repository(self._dir / "model_repository", self.spec.model_name, parameters)
        backends = install.build_backend_dir(self._dir / "backends")
        command = [
            str(install.server_bin),
            f"--model-repository={repository}",
            f"--backend-directory={backends}",
            f"--cache-directory={install.cache_dir}",
            f"--http-port={self.spec.http_port}",
            f"--grpc-port={self.spec.grpc_port}",
            f"--metrics-port={self.spec.metrics_port}",
            f"--grpc-address={self.spec.bind_address}",
            f"--metrics-address={self.spec.bind_address}",
            f"--http-address={LOOPBACK}",
            *server_flags(self.spec.access_token),
            "--disable-auto-complete-config",
            "--allow-gpu-metrics=false",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            f"--exit-timeout-secs={int(self.spec.drain_grace_s) + 30}",
            "--log-verbose=0",
        ]
        env = install.environment(dict(os.environ), python_path=[str(_REPO_ROOT)])
        env.pop(TOKEN_ENV, None)  # the server has it in its flags; the model has no use for it
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=self._dir, start_new_session=True,  # its own process group, stub included
            )

    def wait_ready(self, timeout_s: float = 300.0, interrupted: threading.Event | None = None) -> float:
        """Block until the model answers ready and the metrics port answers; returns the seconds
        waited. Raises LaunchError (with the server log's tail) if the server exits or the timeout
        passes.

        Triton opens its metrics port after its HTTP port: a caller that scraped metrics as soon
        as the model answered ready was refused (CI, tests/replica/test_triton_e2e.py)."""
        process = self._require_process()
        started = self._clock()
        pending = [("model", f"{self.http_url}/v2/models/{self.spec.model_name}/ready"),
                   ("metrics port", self.metrics_url)]  # in the order Triton opens them
        while True:
            if process.poll() is not None:
                self._cleanup_shm()
                raise LaunchError(
                    f"tritonserver exited with code {process.returncode} before the model was ready\n"
                    + self.log_tail()
                )
            while pending and _http_ok(pending[0][1], self.spec.access_token):
                pending.pop(0)
            if not pending:
                return self._clock() - started
            if interrupted is not None and interrupted.is_set():
                raise LaunchError("interrupted while waiting for the model to load")
            if self._clock() - started > timeout_s:
                raise LaunchError(f"{pending[0][0]} not ready after {timeout_s:.0f} s\n"
                                  + self.log_tail())
            self._sleep(0.1)

    def poll(self) -> int | None:
        return self._require_process().poll()

    def engine_dead_reason(self) -> str | None:
        """Why the model's engine loop died, or None while it runs (the model writes the file)."""
        try:
            return self.engine_dead_path.read_text(encoding="utf-8").strip() or "unknown"
        except OSError:
            return None

    def inject_engine_fault(self, message: str = "injected fault") -> None:
        """Fault injection (tests, benchmarks): the model kills its engine loop as a bug would."""
        tmp = self.fault_path.with_suffix(".tmp")
        tmp.write_text(f"{message}\n", encoding="utf-8")
        tmp.replace(self.fault_path)

    def drain(self, grace_s: float | None = None) -> None:
        """Tell the model to refuse new work and end in-flight streams within `grace_s`."""
        grace = self.spec.drain_grace_s if grace_s is None else grace_s
        tmp = self.drain_path.with_suffix(".tmp")
        tmp.write_text(f"{grace}\n", encoding="utf-8")
        tmp.replace(self.drain_path)  # atomic: the model never reads a half-written file

    def stop(self, grace_s: float | None = None, unload_timeout_s: float = 15.0) -> int:
        """Drain, SIGTERM, and SIGKILL the process group if the server outlives the drain by
        `unload_timeout_s`; returns the server's exit code. Afterwards `drained` tells whether
        every stream ended before the server went away (nothing lost), `killed` whether SIGKILL
        was needed (Triton 2.51 sometimes never finishes unloading the model)."""
        process = self._require_process()
        grace = self.spec.drain_grace_s if grace_s is None else grace_s
        if process.poll() is None:
            self.drain(grace)
            _signal_quietly(process.pid, signal.SIGTERM)  # the server stops taking requests too
            deadline = self._clock() + grace + 10.0  # the model aborts what is left at the grace
            while process.poll() is None and not self.drained and self._clock() < deadline:
                self._sleep(0.05)
            try:
                process.wait(timeout=unload_timeout_s)
            except subprocess.TimeoutExpired:
                self.killed = True
        self.drained = self.drained or process.returncode == 0
        _kill_group(process.pid)  # a stub orphaned by a crashed server goes too
        if process.poll() is None:
            process.wait(5.0)
        self._cleanup_shm()
        if self._owns_workdir and self.drained and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return process.returncode

    @property
    def drained(self) -> bool:
        return self._drained or (self.workdir is not None and os.path.exists(drained_marker(str(self.drain_path))))

    @drained.setter
    def drained(self, value: bool) -> None:
        self._drained = value

    def shm_leftovers(self) -> list[str]:
        return sorted(glob.glob(f"/dev/shm/{self.shm_prefix}*"))

    def log_tail(self, num_lines: int = 40) -> str:
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-num_lines:])

    def __enter__(self) -> "ReplicaProcess":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._process is not None:
            self.stop()

    def _require_process(self) -> subprocess.Popen:
        if self._process is None:
            raise RuntimeError("the replica has not been started")
        return self._process

    def _cleanup_shm(self) -> None:
        for path in self.shm_leftovers():
            try:
                os.unlink(path)
            except OSError:
                pass


def _resolve_weights(weights: str) -> str:
    if not weights:
        from replica.engine.models.loader import default_model_path

        weights = str(default_model_path())
    if not os.path.exists(weights):
        raise LaunchError(f"weights not found: {weights} (pass --weights with a GGUF file or a Hugging Face model directory)")
    return os.path.abspath(weights)


def _http_ok(url: str, token: str = "") -> bool:
    try:
        request = urllib.request.Request(url, headers=http_headers(token))
        with urllib.request.urlopen(request, timeout=1.0) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _signal_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
