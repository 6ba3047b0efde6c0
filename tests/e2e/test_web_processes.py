"""Several API processes share one listening socket (llm_platform/web_processes.py, what
`make serve` and the web image run) and every one of them serves, on uvloop's event loop."""
from __future__ import annotations

import json
import socket
from collections import Counter

import httpx
import psutil
import pytest

from llm_platform.web_processes import listen_each
from tests.e2e.conftest import LOG_DIR, platform_env
from tests.support.processes import free_port, start, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

PROCESSES = 3
BURST = 60  # connections: at most ~5e-5 odds that one of 3 processes gets fewer than 6


def burst_pids(port: int, count: int) -> list[int]:
    """The API process that answers each of `count` connections, all opened before any asks."""
    conns = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(count)]
    pids = []
    try:
        for conn in conns:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        for conn in conns:
            reply = b""
            while chunk := conn.recv(65536):
                reply += chunk
            pids.append(json.loads(reply.partition(b"\r\n\r\n")[2])["pid"])
    finally:
        for conn in conns:
            conn.close()
    return pids


def test_api_processes_share_one_port_and_all_serve():
    port = free_port()
    env = platform_env(WEB_PROCESSES=str(PROCESSES), API_REPORT_PROCESS_ID="true")
    proc = start("web-processes", ["-m", "llm_platform.web_processes", "--host", "127.0.0.1",
                                   "--port", str(port)], env, LOG_DIR)
    seen: set[int] = set()
    loops: set[str] = set()

    def every_process_answered() -> bool:
        # A fresh connection each time: the kernel hands each to one of the processes.
        try:
            reply = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        except httpx.HTTPError:
            return False
        seen.add(reply.json()["pid"])
        loops.add(reply.json()["event_loop"])
        return len(seen) == PROCESSES

    children: list[psutil.Process] = []
    try:
        wait_until(every_process_answered, proc, 120, f"{PROCESSES} distinct API processes")
        children = [p for p in psutil.Process(proc.popen.pid).children(recursive=True)
                    if "llm_platform.server" in p.cmdline()]
        assert seen == {p.pid for p in children}  # the supervisor's daphne children, no other
        assert loops == {"uvloop.Loop"}  # llm_platform/server.py: daphne on uvloop
        # A burst of connections opened at once is spread over the processes (each has its
        # own SO_REUSEPORT socket); one shared socket gave a whole burst to one process.
        burst = Counter(burst_pids(port, BURST))
        assert set(burst) == seen and min(burst.values()) >= BURST // PROCESSES // 3, burst
        # A normal request on the same port: the API works, not only the probe.
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 401
    finally:
        proc.stop()
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive  # stopping the supervisor stops every API process


def test_a_port_already_taken_is_refused_not_joined():
    # SO_REUSEPORT would let a second platform of the same user share the port (and its
    # traffic) with a running one: listen_each refuses a taken port as a plain bind does.
    taken = listen_each("127.0.0.1", 0, 2)
    port = taken[0].getsockname()[1]
    try:
        with pytest.raises(OSError):
            listen_each("127.0.0.1", port, 2)
        fresh = listen_each("127.0.0.1", 0, 3)
        assert len({s.getsockname()[1] for s in fresh}) == 1 and len(set(fresh)) == 3
        for sock in fresh:
            sock.close()
    finally:
        for sock in taken:
            sock.close()
