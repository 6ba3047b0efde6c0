"""FileWatch: a stoppable thread that acts once a control file appears (the launcher's drain
file, a test's fault file). The model's only channel from the launcher that needs no port."""
from __future__ import annotations

import os
import threading


class FileWatch:
    """Subclasses implement `_run`, calling `_appeared()` to wait for the file."""

    def __init__(self, path: str, name: str, poll_interval_s: float) -> None:
        self._path = path
        self._poll_interval_s = poll_interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(1.0)

    def _appeared(self) -> bool:
        """Block until the file exists (True) or `stop()` is called (False)."""
        while not self._stopped.wait(self._poll_interval_s):
            if os.path.exists(self._path):
                return True
        return False

    def _run(self) -> None:
        raise NotImplementedError
