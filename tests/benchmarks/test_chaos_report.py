"""The chaos benchmark's bookkeeping (pure logic): how a request's failure is classified around
an API crash, and how recovery after a fault is read from the requests' records."""
from __future__ import annotations

from benchmarks.chaos.load import Crash, LoadClient, Record
from benchmarks.chaos.report import recovery_s, summarize


def rec(name: str, start: float, latency: float, outcome: str = "completed", **kw) -> Record:
    return Record(name, 0, start, end=start + latency, outcome=outcome, **kw)


def client_with_crash(killed_at: float, ready_at: float) -> LoadClient:
    client = LoadClient("http://127.0.0.1:1", ["k"], 16, 60.0, 10.0, lambda: 0.0)
    client.crashes.append(Crash(killed_at=killed_at, ready_at=ready_at))
    return client


def test_a_connection_failure_in_flight_at_the_kill_is_cut_by_the_crash():
    client = client_with_crash(killed_at=10.0, ready_at=13.0)
    record = rec("a", 9.0, 1.05, "lost", connection_failure=True)
    assert client._classify_connection_failure(record) is client.crashes[0]
    assert record.outcome == "cut_by_crash"


def test_a_refused_connection_while_the_api_is_down_is_not_accepted():
    client = client_with_crash(killed_at=10.0, ready_at=13.0)
    record = rec("b", 11.0, 0.01, "lost", connection_failure=True, connect_refused=True)
    client._classify_connection_failure(record)
    assert record.outcome == "refused_api_down"


def test_a_connection_failure_far_from_any_crash_stays_lost():
    client = client_with_crash(killed_at=10.0, ready_at=13.0)
    record = rec("c", 30.0, 2.0, "lost", connection_failure=True)
    assert client._classify_connection_failure(record) is None
    assert record.outcome == "lost"


def test_a_clear_error_is_never_reclassified():
    client = client_with_crash(killed_at=10.0, ready_at=13.0)
    record = rec("d", 9.0, 2.0, "failed_with_error", status=503)
    client._classify_connection_failure(record)
    assert record.outcome == "failed_with_error"


def test_recovery_is_the_first_run_of_normal_requests_after_the_fault():
    records = [rec(f"r{i}", 100.0 + 2 * i, 1.0) for i in range(20)]
    records[1].outcome = "failed_with_error"   # sent at 102
    for slow in records[2:4]:                   # sent at 104 and 106: far slower than baseline
        slow.end = slow.start + 30.0
    # baseline 1.0 s -> bound 4 s on a run's median: the run r3 r4 r5 (from 106) is normal
    assert recovery_s(records, 100.0, 140.0, baseline=1.0, window_requests=3) == 6.0


def test_no_normal_run_before_the_next_fault_means_not_recovered():
    records = [rec(f"r{i}", 100.0 + i, 1.0, "lost") for i in range(10)]
    assert recovery_s(records, 100.0, 110.0, baseline=1.0, window_requests=3) is None


def test_summary_counts_every_sent_request_once_and_refusals_are_not_accepted():
    records = [rec(f"b{i}", float(i), 1.0) for i in range(10)]  # baseline before the fault
    records += [rec("x", 10.5, 1.0, "cut_by_crash"), rec("y", 11.0, 0.0, "refused_api_down"),
                rec("z", 12.0, 90.0, "lost", detail="no end within 90 s")]
    records += [rec(f"a{i}", 13.0 + i, 1.0) for i in range(10)]
    faults = [{"fault": "api_kill", "at_s": 10.0, "restored_after_s": 2.5, "details": {}}]
    out = summarize(records, faults, load_end=30.0, window_requests=3, target_recovery_s=30.0)
    assert (out["sent"], out["accepted"]) == (23, 22)
    assert (out["completed"], out["cut_by_crash"], out["lost"]) == (20, 1, 1)
    assert out["recovery_s"] == {"api_kill": 3.0}
    assert out["faults"][0]["latency_of_those_completed_s"] == {"p50": 1.0, "max": 1.0}
    assert out["cut_by_crash_retries"] == {"not retried": 1}
    assert out["lost_examples"][0]["detail"] == "no end within 90 s"
