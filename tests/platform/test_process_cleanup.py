"""Processes started through scripts/children.py never outlive their starter: not when it is
interrupted (SIGTERM: `finally` and atexit run), nor when it is killed outright (SIGKILL: the
kernel's parent-death signal). Real processes: a starter script and its `sleep` child."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.processes import REPO
from tests.support.waiting import wait_until

STARTER = """
import sys, time
from scripts.children import spawn, stop_on_signals
stop_on_signals()
child = spawn(["sleep", "600"])
try:
    print(child.pid, flush=True)
    time.sleep(600)  # a stand-in parent that lives until it is stopped
finally:
    print("finally", flush=True)
"""


def _alive(pid: int) -> bool:
    """Running (a zombie, exited and not yet reaped by init, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone(pid: int, within_s: float = 15.0) -> bool:
    """The (reparented, so not waitable) process has exited within `within_s`."""
    try:
        wait_until(lambda: not _alive(pid), within_s, f"exit of process {pid}", period_s=0.05)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_children_stop_with_their_starter(how):
    starter = subprocess.Popen([sys.executable, "-c", STARTER], cwd=REPO,
                               stdout=subprocess.PIPE, text=True)
    child_pid = int(starter.stdout.readline())
    try:
        os.kill(starter.pid, how)
        starter.wait(30)
        if how == signal.SIGTERM:
            assert "finally" in starter.stdout.read()  # interrupted, its cleanup ran
        assert _gone(child_pid), "the child outlived its starter"
    finally:
        if _alive(child_pid):
            os.kill(child_pid, signal.SIGKILL)
