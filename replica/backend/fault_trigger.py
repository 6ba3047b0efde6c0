"""FaultTrigger: fault injection for tests and benchmarks (`replica.launch --fault-file`).

When the file appears, the engine loop is killed as a bug would kill it (EngineLoop.inject_fault,
with the file's text as the message), so the whole dead-engine path (error outputs, the
`replica_engine_alive` metric, the dead marker, the launcher stopping the server, the platform
marking the replica failed and replacing it) can be exercised on a real replica. Without the
model parameter `fault_file` nothing watches.
"""
from __future__ import annotations

import logging
from typing import Callable

from replica.backend.file_watch import FileWatch


class FaultTrigger(FileWatch):
    def __init__(self, path: str, on_fault: Callable[[str], None], *, poll_interval_s: float = 0.1,
                 logger: logging.Logger | None = None) -> None:
        super().__init__(path, "fault-trigger", poll_interval_s)
        self._on_fault = on_fault
        self._log = logger or logging.getLogger(__name__)

    def _run(self) -> None:
        if not self._appeared():
            return
        try:
            with open(self._path, encoding="utf-8") as f:
                message = f.read().strip() or "injected fault"
        except OSError:
            message = "injected fault"
        self._log.warning("fault injection via %s: killing the engine loop (%s)", self._path, message)
        self._on_fault(message)
