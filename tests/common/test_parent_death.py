"""common/parent_death.py: a child started through `dies_with_parent` gets SIGTERM when its
parent dies, even by SIGKILL, and no Python code runs in the child between fork and exec."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from common.parent_death import dies_with_parent
from tests.support.waiting import wait_until

PARENT = """
import subprocess, sys, time
from common.parent_death import dies_with_parent
child = subprocess.Popen(dies_with_parent([sys.executable, "-c", "import time; time.sleep(120)"]))
print(child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead (reaped by init later)
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_child_dies_with_its_killed_parent():
    command = dies_with_parent(["true"])
    assert os.path.basename(command[0]) == "setpriv"  # on this Linux
    assert command[-2:] == [str(os.getpid()), "true"]  # the parent to check, then the command
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    child_pid = int(parent.stdout.readline())
    # setpriv arms the signal, then execs the command: once the command runs, it is armed
    # (setpriv's own command line holds the command too: look at the program).
    def program() -> str:
        with open(f"/proc/{child_pid}/cmdline", "rb") as cmdline:
            return os.path.basename(cmdline.read().split(b"\0")[0].decode())
    wait_until(lambda: program() != "setpriv", 10.0, "setpriv exec'ing the command")
    assert _alive(child_pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    wait_until(lambda: not _alive(child_pid), 10.0, "the child's parent-death SIGTERM")
    assert not _alive(child_pid)


def test_no_preexec_python_is_left_in_the_spawners():
    """Python between fork and exec crashed a child when grpc's threads were busy: the
    spawners pass no preexec_fn."""
    import inspect

    import fleet.node_agent
    import scripts.children
    for module in (scripts.children, fleet.node_agent):
        assert "preexec_fn" not in inspect.getsource(module), module.__name__


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_whose_starter_is_already_gone_does_not_run_its_command(tmp_path):
    """Armed too late (its starter died before `setpriv` ran), the signal would never come:
    the child sees a parent other than the one that started it and exits."""
    marker = tmp_path / "ran"
    command = dies_with_parent(["touch", str(marker)])
    command[-3] = "1"  # as if started by a process that is gone (the child's parent is us)
    assert subprocess.run(command, timeout=10).returncode == 143
    assert not marker.exists()
    command[-3] = str(os.getpid())  # started by us, alive: the command runs
    assert subprocess.run(command, timeout=10).returncode == 0
    assert marker.exists()
