"""Starting and stopping the real processes the e2e tests talk to."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from scripts.children import spawn, stop_group
from scripts.services import free_port, free_ports  # noqa: F401 - re-exported for the tests
from tests.support.waiting import wait_until as poll_until

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path

    def log_tail(self, num_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        stop_group(self.popen, timeout)


def start(name: str, args: list[str], env: dict[str, str], log_dir: Path) -> Proc:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    log = open(log_path, "wb")
    # Its own process group, stopped with the test run even when the run is interrupted
    # (scripts/children.py: atexit, SIGTERM -> SystemExit, the kernel's parent-death signal).
    popen = spawn([sys.executable, *args], cwd=REPO, env={**os.environ, **env}, stdout=log,
                  stderr=subprocess.STDOUT)
    return Proc(name, popen, log_path)


def wait_until(check, proc: Proc, deadline_s: float, what: str) -> None:
    """Poll `check()` until true; fail with the process log if it dies or the deadline passes
    (a guard against hangs, not a performance threshold)."""
    def done():
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}) before {what}:\n"
                               + proc.log_tail())
        try:
            return check()
        except (OSError, httpx.HTTPError):
            return False

    try:
        poll_until(done, deadline_s, what, period_s=0.2)
    except AssertionError as exc:
        raise RuntimeError(f"{proc.name}: {exc}:\n" + proc.log_tail()) from None


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def http_ok(url: str) -> bool:
    return httpx.get(url, timeout=2.0).status_code == 200
