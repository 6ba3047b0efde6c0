"""The local durable outbox: where usage events go when the Redis stream cannot take them.

Why a file: the outbox exists for when shared infrastructure is down, so it must not depend on
Redis or PostgreSQL; a local append-only file with fsync is the smallest thing that survives a
process crash. One JSON event per line; every append starts with a newline, so a line torn by a
crash mid-write ends before the next append's first event (empty lines are skipped), and a
torn or corrupt line is skipped without taking the next event with it. Appends check that
every byte was written and fsync the file, and the directory when they created the file (and
after the rename that seals it). Several processes on a host share the directory:
`append` and the rename in `take_batches` hold an exclusive flock on `outbox.lock`, so a line is
never written into a file that is already being replayed.

Replay is at-least-once: a file is renamed to `*.replay`, every line is sent, then the file is
deleted. A crash mid-replay sends the file again later; the consumer's unique request id makes
the duplicates harmless.
"""
from __future__ import annotations

import fcntl
import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from billing.events import UsageEvent

logger = logging.getLogger(__name__)

ACTIVE = "outbox.jsonl"


class FileOutbox:
    def __init__(self, directory: Path | str, clock: Callable[[], float] = time.time):
        self.directory = Path(directory)
        self.clock = clock

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / "outbox.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def append(self, events: list[UsageEvent]) -> None:
        """Durable when it returns (every byte written, file and directory fsynced); raises
        OSError otherwise."""
        data = ("\n" + "".join(event.to_json() + "\n" for event in events)).encode()
        with self._locked():
            path = self.directory / ACTIVE
            created = not path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                _fsync_directory(self.directory)

    def has_pending(self) -> bool:
        if not self.directory.is_dir():
            return False
        return any(p.name == ACTIVE or p.suffix == ".replay" for p in self.directory.iterdir())

    def _seal_active(self) -> None:
        with self._locked():
            active = self.directory / ACTIVE
            if active.exists() and active.stat().st_size > 0:
                active.rename(self.directory / f"outbox-{self.clock():.6f}-{os.getpid()}.replay")
                _fsync_directory(self.directory)

    def replay(self, send: Callable[[list[UsageEvent]], None], batch_size: int = 500) -> int:
        """Send every pending event with `send` (which raises if it could not); returns how
        many were sent. A file is deleted only after all its events were sent."""
        if not self.has_pending():
            return 0
        self._seal_active()
        num_sent = 0
        for path in sorted(self.directory.glob("*.replay")):
            batch: list[UsageEvent] = []
            for event in self._read(path):
                batch.append(event)
                if len(batch) >= batch_size:
                    send(batch)
                    num_sent += len(batch)
                    batch = []
            if batch:
                send(batch)
                num_sent += len(batch)
            path.unlink()
        return num_sent

    @staticmethod
    def _read(path: Path) -> Iterator[UsageEvent]:
        with open(path, "rb") as f:
            for line in f:
                if not line.strip():
                    continue
                if not line.endswith(b"\n"):
                    logger.warning("outbox %s: skipping a torn last line", path)
                    continue
                try:
                    yield UsageEvent.from_json(line)
                except (ValueError, TypeError, UnicodeDecodeError):
                    logger.error("outbox %s: unreadable line kept out: %r", path, line[:200])


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(f"outbox: wrote {written} of {len(view)} bytes")
        view = view[written:]


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
