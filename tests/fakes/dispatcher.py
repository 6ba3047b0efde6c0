"""A Dispatcher (fleet/dispatch.py) that keeps what would have been sent, for fleet tests."""
from __future__ import annotations


class RecordingDispatcher:
    def __init__(self):
        self.sent: list[tuple[str, str, int]] = []

    def start(self, queue: str, replica_id: int) -> None:
        self.sent.append(("start", queue, replica_id))

    def stop(self, queue: str, replica_id: int) -> None:
        self.sent.append(("stop", queue, replica_id))
