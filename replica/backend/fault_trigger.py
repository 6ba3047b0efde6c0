"""FaultTrigger: fault injection for tests and benchmarks (`replica.launch --fault-file`).

When the file appears, the engine loop is killed as a bug would kill it (EngineLoop.inject_fault,
with the file's text as the message), so the whole dead-engine path (error outputs, the
`replica_engine_alive` metric, the dead marker, the launcher stopping the server, the platform
marking the replica failed and replacing it) can be exercised on a real replica. Without the
model parameter `fault_file` nothing watches.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Callable


class FaultTrigger:
    def __init__(self, path: str, on_fault: Callable[[str], None], *, poll_interval_s: float = 0.1,
                 logger: logging.Logger | None = None) -> None:
        self._path = path
        self._on_fault = on_fault
        self._poll_interval_s = poll_interval_s
        self._log = logger or logging.getLogger(__name__)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-trigger", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(1.0)

    def _run(self) -> None:
        while not self._stopped.wait(self._poll_interval_s):
            if os.path.exists(self._path):
                try:
                    with open(self._path, encoding="utf-8") as f:
                        message = f.read().strip() or "injected fault"
                except OSError:
                    message = "injected fault"
                self._log.warning("fault injection via %s: killing the engine loop (%s)", self._path, message)
                self._on_fault(message)
                return
