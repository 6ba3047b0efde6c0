"""Child processes that never outlive whoever started them (tests, benchmarks, `make serve`).

A child started with `spawn` runs in its own process group (so stopping it stops what it
started too: daphne's workers, tritonserver under replica.launch) and gets SIGTERM from the
kernel if its parent dies, even by SIGKILL (Linux PR_SET_PDEATHSIG, set by `setpriv`:
common/parent_death.py). `Children.stop_all` runs
at exit, and `stop_on_signals` turns SIGTERM/SIGHUP into SystemExit, so `finally` blocks and
pytest finalizers run when a run is interrupted instead of leaving daphne and replicas behind
(an interrupted fairness benchmark left both running before).
"""
from __future__ import annotations

import atexit
import os
import signal
import subprocess
import threading

from common.parent_death import dies_with_parent


def stop_group(popen: subprocess.Popen, timeout_s: float = 20.0) -> None:
    """SIGTERM the child's process group, then SIGKILL it after `timeout_s`."""
    if popen.poll() is not None:
        return
    try:
        os.killpg(popen.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        popen.wait(timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        popen.wait()


class Children:
    """The children this process started and has not stopped yet."""

    def __init__(self):
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        atexit.register(self.stop_all)

    def spawn(self, args: list[str], **kwargs) -> subprocess.Popen:
        kwargs.setdefault("start_new_session", True)
        # PDEATHSIG fires when the forking *thread* ends: only from the main thread. Set by
        # `setpriv` in the child, not by Python code between fork and exec
        # (common/parent_death.py).
        main = threading.current_thread() is threading.main_thread()
        popen = subprocess.Popen(dies_with_parent(args) if main else args, **kwargs)
        with self._lock:
            self._procs = [p for p in self._procs if p.poll() is None] + [popen]
        return popen

    def stop_all(self, timeout_s: float = 20.0) -> None:
        with self._lock:
            procs, self._procs = self._procs, []
        for popen in procs:  # SIGTERM all first, so they shut down together
            if popen.poll() is None:
                try:
                    os.killpg(popen.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for popen in reversed(procs):
            stop_group(popen, timeout_s)


CHILDREN = Children()  # one per process: atexit needs one place that knows every child


def spawn(args: list[str], **kwargs) -> subprocess.Popen:
    return CHILDREN.spawn(args, **kwargs)


def stop_on_signals(signals=(signal.SIGTERM, signal.SIGHUP)) -> None:
    """SIGTERM/SIGHUP raise SystemExit in the main thread: `finally` blocks and atexit run."""

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    for sig in signals:
        signal.signal(sig, handler)
