"""Managed: one process the chaos benchmark runs, in a process group of its own, that can be
SIGKILLed (the fault) and started again with the same command; `stop()` never leaves its group
or the groups its descendants made (tritonserver under replica.launch) behind."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[2]


class StackError(RuntimeError):
    pass


def wait_for(check, what: str, deadline_s: float, proc: "Managed | None" = None) -> float:
    """Polls `check()` until true; returns the seconds it took. Raises with the log tail when
    the process exits first or the deadline passes (a guard against hangs)."""
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        if proc is not None and proc.popen is not None and proc.popen.poll() is not None:
            raise StackError(f"{proc.name} exited ({proc.popen.returncode}) before {what}:\n"
                             + proc.log_tail())
        try:
            if check():
                return time.monotonic() - start
        except (OSError, httpx.HTTPError):
            pass
        time.sleep(0.1)
    raise StackError(f"no {what} after {deadline_s} s" + (f":\n{proc.log_tail()}" if proc else ""))


def http_ok(url: str) -> bool:
    return httpx.get(url, timeout=2.0).status_code == 200


@dataclass
class Managed:
    """One process (and its process group) the stack runs; `start()` again after a kill."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    run_as: dict = field(default_factory=dict)
    popen: subprocess.Popen | None = None
    starts: int = 0
    pids: list[int] = field(default_factory=list)  # every start's group leader

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(f"\n=== start {self.starts + 1} at {time.time():.3f} ===\n".encode())
        log.flush()
        self.popen = subprocess.Popen(self.argv, cwd=REPO, env=self.env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True,
                                      **self.run_as)
        log.close()
        self.starts += 1
        self.pids.append(self.popen.pid)

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal_group(self, sig: int) -> None:
        if self.popen is not None:
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass

    def sigkill(self) -> None:
        """The fault: SIGKILL the whole group, then reap it."""
        self.signal_group(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait()

    def stop(self, grace_s: float = 20.0, sig: int = signal.SIGTERM) -> None:
        if self.popen is None:
            return
        extra_groups = self._child_groups()
        if self.popen.poll() is None:
            self.signal_group(sig)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self.popen.wait()
        else:  # the group may outlive its leader
            self.signal_group(signal.SIGKILL)
        for pgid in extra_groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _child_groups(self) -> list[int]:
        """Process groups of descendants that left this one (tritonserver under replica.launch)."""
        if self.popen is None:
            return []
        try:
            children = psutil.Process(self.popen.pid).children(recursive=True)
        except psutil.Error:
            return []
        groups = set()
        for child in children:
            try:
                groups.add(os.getpgid(child.pid))
            except ProcessLookupError:
                pass
        groups.discard(self.popen.pid)
        return sorted(groups)

    def log_tail(self, num_chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except OSError:
            return ""
