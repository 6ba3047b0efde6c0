"""DrainWatcher: turns the launcher's drain file into a call on the model (`EngineLoop.drain`).

The launcher writes the file (optionally holding the grace period in seconds) and sends SIGTERM to
tritonserver; the model then refuses new work and ends in-flight streams within the grace period,
so the server's own shutdown never waits on a stream that does not end. Once nothing is open, the
watcher writes `<file>.drained`, telling the launcher that no stream can be lost any more.
"""
from __future__ import annotations

import logging
import os
from typing import Callable

from replica.backend.file_watch import FileWatch


def drained_marker(drain_file: str) -> str:
    return f"{drain_file}.drained"


class DrainWatcher(FileWatch):
    def __init__(
        self,
        path: str,
        on_drain: Callable[[float], None],
        wait_drained: Callable[[float], bool],
        *,
        default_grace_s: float,
        poll_interval_s: float = 0.1,
        logger: logging.Logger | None = None,
    ) -> None:
        super().__init__(path, "drain-watcher", poll_interval_s)
        self._on_drain = on_drain
        self._wait_drained = wait_drained  # (timeout_s) -> True once nothing is open
        self._default_grace_s = default_grace_s
        self._log = logger or logging.getLogger(__name__)

    def _run(self) -> None:
        if not self._appeared():
            return
        grace_s = self._read_grace_s()
        self._on_drain(grace_s)
        # Logged once applied: from this line on new requests are refused (tests wait for it).
        self._log.info("drain requested via %s: grace %.1f s", self._path, grace_s)
        while not self._stopped.is_set():
            if self._wait_drained(self._poll_interval_s):
                self._write_marker()
                self._log.info("drained: no request open")
                return

    def _read_grace_s(self) -> float:
        try:
            with open(self._path, encoding="utf-8") as f:
                text = f.read().strip()
            return float(text) if text else self._default_grace_s
        except (OSError, ValueError):
            return self._default_grace_s

    def _write_marker(self) -> None:
        marker = drained_marker(self._path)
        try:
            with open(marker + ".tmp", "w", encoding="utf-8") as f:
                f.write("drained\n")
            os.replace(marker + ".tmp", marker)
        except OSError:
            self._log.exception("could not write %s", marker)
