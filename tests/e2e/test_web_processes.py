"""Several API processes share one listening socket (llm_platform/web_processes.py, what
`make serve` and the web image run) and every one of them serves, on uvloop's event loop."""
from __future__ import annotations

import httpx
import psutil
import pytest

from tests.e2e.conftest import LOG_DIR, platform_env
from tests.support.processes import free_port, start, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

PROCESSES = 3


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
        # A normal request on the same port: the API works, not only the probe.
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 401
    finally:
        proc.stop()
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive  # stopping the supervisor stops every API process
