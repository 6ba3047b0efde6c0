"""llm_platform.web_processes.supervise: the API processes' supervisor under signals.

A real supervisor process with a stand-in API process (a Python child that says on stdout when
it has its SIGTERM and exits when its stdin closes: an API process still draining). Every step
waits on a line the processes write, never on time."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading

import pytest

from tests.support.processes import REPO

pytestmark = pytest.mark.timeout(120)
WAIT_S = 60  # a hang guard: each line comes in milliseconds

CHILD = """
import signal, sys
signal.signal(signal.SIGTERM, lambda *_: print("child: SIGTERM", flush=True))
print("child: ready", flush=True)
sys.stdin.read()  # draining until the test lets it go
"""

SUPERVISOR = f"""
import subprocess, sys
from llm_platform.web_processes import supervise
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}])
sys.exit(supervise([child], grace_s=120))
"""


def _lines(stream) -> queue.Queue:
    """The stream's lines as they come, from a thread (a read that never ends fails the wait
    below instead of hanging the test: the child holds the supervisor's pipes open)."""
    lines: queue.Queue = queue.Queue()

    def pump():
        for line in stream:
            lines.put(line)
        lines.put("")  # EOF

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _next(lines: queue.Queue, what: str) -> str:
    try:
        return lines.get(timeout=WAIT_S)
    except queue.Empty:
        raise AssertionError(f"no {what} after {WAIT_S} s") from None


def _supervisor() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SUPERVISOR], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def test_a_second_sigterm_while_stopping_lets_the_stop_finish():
    supervisor = _supervisor()
    out, err = _lines(supervisor.stdout), _lines(supervisor.stderr)
    try:
        assert _next(out, "child ready") == "child: ready\n"
        supervisor.send_signal(signal.SIGTERM)
        assert _next(out, "child's SIGTERM") == "child: SIGTERM\n"  # the stop is under way
        supervisor.send_signal(signal.SIGTERM)  # again, while the child drains
        said = _next(err, "word of the second signal")
        assert said.startswith(f"signal {int(signal.SIGTERM)} while stopping: "
                               "the stop goes on"), said
        assert supervisor.poll() is None  # still waiting for its child
        supervisor.stdin.close()  # the child's drain ends
        assert supervisor.wait(WAIT_S) == 0
        rest = []
        while (line := _next(err, "the end of stderr")) != "":
            rest.append(line)
        assert "Traceback" not in "".join(rest)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()


def test_a_child_that_exits_stops_the_others_with_its_status():
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR.replace("sys.stdin.read()", "sys.exit(3)")],
        cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert supervisor.wait(WAIT_S) == 3
        assert "exited with 3; stopping the others" in supervisor.stderr.read()
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()


KILLED_SUPERVISOR = f"""
import sys
from llm_platform import web_processes
socks = web_processes.listen_each("127.0.0.1", 0, 1)
child_code = {CHILD!r}
children = web_processes.start(socks, command=lambda fd, args: [sys.executable, "-c", child_code])
print(f"supervisor: started {{children[0].pid}}", flush=True)
sys.exit(web_processes.supervise(children, grace_s=120))
"""


def test_api_processes_get_sigterm_when_their_supervisor_is_killed():
    """An API process outliving a SIGKILLed (or OOM-killed) supervisor kept serving on the
    port, and a restarted supervisor could not bind it: the kernel now sends it SIGTERM."""
    supervisor = subprocess.Popen([sys.executable, "-c", KILLED_SUPERVISOR], cwd=REPO,
                                  text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
    out = _lines(supervisor.stdout)  # the child writes to the same pipe
    child_pid = None
    try:
        started = _next(out, "the child's start")
        assert started.startswith("supervisor: started "), started
        child_pid = int(started.split()[-1])
        assert _next(out, "child ready") == "child: ready\n"
        supervisor.kill()
        supervisor.wait(WAIT_S)
        assert _next(out, "the orphan's SIGTERM") == "child: SIGTERM\n"
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
        supervisor.stdin.close()  # the stand-in then leaves (it drains until stdin closes)
        if child_pid is not None:
            try:
                os.kill(child_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
