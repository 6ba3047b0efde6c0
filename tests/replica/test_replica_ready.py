"""ReplicaProcess.wait_ready returns only once both the model's readiness URL and the metrics port
answer: Triton opens its metrics port after its HTTP port, and a caller that scraped metrics as
soon as the model answered ready was refused (CI on tests/replica/test_triton_e2e.py).

Real HTTP servers on loopback stand in for Triton's two ports; the waiting loop's sleep is
injected and opens the metrics port on its third call, so nothing here waits on time.
"""
from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from replica.replica_process import LaunchError, ReplicaProcess, ReplicaSpec
from scripts.services import free_ports


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        body = b"replica_ok 1\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _serve(port: int) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def stand_in_server():
    """A live process for wait_ready to poll (it checks the server has not exited)."""
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    yield process
    process.kill()
    process.wait()


def _replica(tmp_path: Path, process, http_port: int, metrics_port: int, sleep, clock=None) -> ReplicaProcess:
    spec = ReplicaSpec(model_name="m", grpc_port=1, http_port=http_port, metrics_port=metrics_port, workdir=tmp_path)
    replica = ReplicaProcess(spec, sleep=sleep, **({"clock": clock} if clock else {}))
    replica._process = process  # started: wait_ready is what is under test
    return replica


def test_ready_waits_for_the_metrics_port_after_the_model_answers(tmp_path, stand_in_server):
    http_port, metrics_port = free_ports(2)
    servers = [_serve(http_port)]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:  # the metrics port opens while the caller waits
            servers.append(_serve(metrics_port))

    try:
        _replica(tmp_path, stand_in_server, http_port, metrics_port, sleep).wait_ready(timeout_s=60)
        assert len(sleeps) == 3, "returned before the metrics port answered"
        assert len(servers) == 2
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_a_metrics_port_that_never_opens_is_named_in_the_timeout(tmp_path, stand_in_server):
    http_port, metrics_port = free_ports(2)
    server = _serve(http_port)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    try:
        replica = _replica(tmp_path, stand_in_server, http_port, metrics_port, sleep, clock=lambda: now[0])
        with pytest.raises(LaunchError, match="metrics port not ready after 5 s"):
            replica.wait_ready(timeout_s=5)
    finally:
        server.shutdown()
        server.server_close()
