"""`python -m benchmarks.chaos --smoke`: the chaos benchmark runs end to end on its own private
platform (PostgreSQL, Redis, daphne, billing consumer, two real SmolLM2 replicas), stops every
process it started, and writes the JSON the issue asks for. Asserts its shape, and the targets
that do not depend on this machine's speed: nothing lost, a stream cut by the API crash is
retried with its Idempotency-Key without waiting out the pending TTL, and every computed token
is billed once (the reaper, run by Celery beat, finalises the cut stream's row)."""
from __future__ import annotations

import json
import subprocess
import sys

import psutil
import pytest

from tests.support.processes import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_smoke_run_writes_the_report_and_leaves_no_process(tmp_path):
    out = tmp_path / "chaos.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.chaos", "--smoke", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "injecting api_kill" in done.stdout and "t=" in done.stdout  # progress lines
    report = json.loads(out.read_text())

    for key in ("accepted", "completed", "failed_with_error", "cut_by_crash", "lost",
                "computed_tokens", "billed_tokens"):
        assert isinstance(report[key], int) and report[key] >= 0, key
    assert report["accepted"] == (report["completed"] + report["failed_with_error"]
                                  + report["cut_by_crash"] + report["lost"])
    assert report["sent"] == report["accepted"] + report["refused_api_down"]
    assert report["completed"] > 0 and report["computed_tokens"] > 0
    assert report["billed_tokens"] > 0 and report["billing_drain"]["drained"] is True
    assert set(report["recovery_s"]) == {"api_kill", "billing_kill"}
    for value in report["recovery_s"].values():
        assert value is None or value >= 0
    assert [f["fault"] for f in report["faults"]] == ["api_kill", "billing_kill"]
    assert sum(report["cut_by_crash_retries"].values()) == report["cut_by_crash"]
    assert report["computed"]["method"] and report["computed"]["complete"] is True
    assert set(report["targets_met"]) == {"lost_zero", "billed_equals_computed",
                                          "every_fault_recovered"}
    assert report["lost"] == 0, report["lost_examples"]
    assert set(report["cut_by_crash_retries"]) <= {"succeeded"}, \
        report["cut_by_crash_retry_details"]
    assert report["billing_drain"]["pending_rows"] == 0
    assert report["billed_tokens"] == report["computed_tokens"], report["computed"]

    run_dir = REPO / "var" / f"chaos-{report['run_id']}"
    assert not (run_dir / "pg").exists()  # the private database server's data is gone
    started = report["processes_started"]
    assert {"postgres", "redis", "daphne", "billingconsumer", "celery-worker", "celery-beat",
            "replica-0", "replica-1"} <= set(started)
    assert len(started["daphne"]) == 2 and len(started["billingconsumer"]) == 2  # restarted once
    assert report["processes_alive_after_stop"] == []
    for pid in (p for pids in started.values() for p in pids):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
