"""The outbox's record format: a torn line never swallows the next event; every byte is written."""
import os

import pytest

from billing import outbox as outbox_module
from billing.events import UsageEvent
from billing.outbox import ACTIVE, FileOutbox


def make_event(request_id: str) -> UsageEvent:
    return UsageEvent(request_id=request_id, tenant_id=1, api_key_id=1, model_name="m",
                      model_version_id=1, replica_id=None, input_tokens=3, cached_tokens=0,
                      output_tokens=2, ttft_ms=None, total_ms=1.0, status="ok")


def replayed(outbox: FileOutbox) -> list[str]:
    sent: list[str] = []
    outbox.replay(lambda batch: sent.extend(e.request_id for e in batch))
    return sent


def test_a_torn_line_does_not_swallow_the_next_event(tmp_path):
    outbox = FileOutbox(tmp_path)
    outbox.append([make_event("a")])
    with open(tmp_path / ACTIVE, "ab") as f:
        f.write(b'{"v":1,"request_id":"torn","tenant')  # a crash mid-write: no newline
    outbox.append([make_event("b"), make_event("c")])
    assert replayed(outbox) == ["a", "b", "c"]
    assert not outbox.has_pending()


def test_a_corrupt_line_in_the_middle_is_skipped(tmp_path):
    outbox = FileOutbox(tmp_path)
    outbox.append([make_event("a")])
    with open(tmp_path / ACTIVE, "ab") as f:
        f.write(b"\xff\xfe not json\n")
    outbox.append([make_event("b")])
    assert replayed(outbox) == ["a", "b"]


def test_short_writes_are_completed(tmp_path, monkeypatch):
    real_write = os.write
    calls = []

    def dribble(fd, data):
        calls.append(len(data))
        return real_write(fd, bytes(data[:7]))  # the kernel may take fewer bytes than asked

    monkeypatch.setattr(outbox_module.os, "write", dribble)
    outbox = FileOutbox(tmp_path)
    outbox.append([make_event("a"), make_event("b")])
    monkeypatch.setattr(outbox_module.os, "write", real_write)
    assert len(calls) > 2
    assert replayed(outbox) == ["a", "b"]


def test_a_write_that_makes_no_progress_raises(tmp_path, monkeypatch):
    monkeypatch.setattr(outbox_module.os, "write", lambda fd, data: 0)
    with pytest.raises(OSError):
        FileOutbox(tmp_path).append([make_event("a")])


def test_creating_the_file_fsyncs_the_directory(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def record(fd):
        synced.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(outbox_module.os, "fsync", record)
    FileOutbox(tmp_path).append([make_event("a")])
    assert str(tmp_path / ACTIVE) in synced and str(tmp_path) in synced


def test_the_wire_form_round_trips_and_stays_one_line(tmp_path):
    """to_json (orjson: compact, non-ASCII as UTF-8) reads back the same event, as the stdlib's
    json reads it, and never holds a newline byte (the outbox's record separator)."""
    import json
    from dataclasses import replace

    event = replace(make_event("r\n1"), model_name="modèle\u2028日本\n", ttft_ms=12.345678901,
                    total_ms=1e-05, occurred_at=1796121824.9994123, finish_reason="stop")
    wire = event.to_json()
    assert "\n" not in wire and UsageEvent.from_json(wire) == event
    assert UsageEvent.from_json(wire.encode()) == event
    assert json.loads(wire) == {"v": 1, **event.__dict__}
    outbox = FileOutbox(tmp_path)
    outbox.append([event, make_event("b")])
    sent = []
    outbox.replay(sent.extend)
    assert sent == [event, make_event("b")]
