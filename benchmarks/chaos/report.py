"""From the requests' records and the faults' timeline to the benchmark's numbers (pure logic).

Recovery of one fault: the baseline is the load before the first fault (completed requests'
median latency, `baseline_p50_s`). After the fault is injected at t0, a run of
`window_requests` consecutive requests (in send order; the load is open loop at a steady rate,
so that is a stretch of time) is *normal* when every one of them completed and their median
latency is at most `slow_factor` (3) x baseline_p50_s + 1 s (this 2-core machine is shared:
its noise alone moved latencies by 2x in trial runs). recovery_s = (send time of the first request of
the first normal run) - t0, looking only at requests sent before the next fault (or the end of
the load); None when no run was normal. So a fault nobody noticed recovers in about one
inter-arrival time, and a request failing 20 s after the fault pushes recovery past it.
"""
from __future__ import annotations

import statistics
from collections import Counter

OUTCOMES = ("completed", "failed_with_error", "cut_by_crash", "lost", "refused_api_down")


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def baseline_p50(records, until: float) -> float | None:
    return median([r.latency for r in records
                   if r.kind == "load" and r.outcome == "completed" and r.start < until])


def recovery_s(records, t0: float, t_end: float, baseline: float,
               window_requests: int, slow_factor: float = 3.0) -> float | None:
    sent = sorted((r for r in records if r.kind == "load" and t0 <= r.start < t_end),
                  key=lambda r: r.start)
    bound = slow_factor * baseline + 1.0
    for i in range(len(sent) - window_requests + 1):
        window = sent[i:i + window_requests]
        if all(r.outcome == "completed" for r in window) and \
                statistics.median(r.latency for r in window) <= bound:
            return round(window[0].start - t0, 2)
    return None


def outcome_counts(records) -> dict[str, int]:
    counts = Counter(r.outcome for r in records)
    return {name: counts.get(name, 0) for name in OUTCOMES}


def summarize(records, faults: list[dict], load_end: float, window_requests: int,
              target_recovery_s: float, slow_factor: float = 3.0) -> dict:
    """The request side of the report: totals, per-fault recovery and outcomes, examples."""
    load = [r for r in records if r.kind == "load"]
    counts = outcome_counts(load)
    accepted = len(load) - counts["refused_api_down"]
    first_fault = faults[0]["at_s"] if faults else load_end
    base = baseline_p50(load, first_fault)
    cut = [r for r in load if r.outcome == "cut_by_crash"]
    retries = Counter(r.retry.outcome if r.retry else "not retried" for r in cut)
    per_fault = []
    for i, fault in enumerate(faults):
        t0 = fault["at_s"]
        t_end = faults[i + 1]["at_s"] if i + 1 < len(faults) else load_end
        rec = (recovery_s(load, t0, t_end, base, window_requests, slow_factor)
               if base is not None else None)
        ended = [r for r in load if t0 <= r.end < t_end]
        # The stall a fault causes shows here even when recovery_s (a run's median) is small.
        done_after = [r.latency for r in ended if r.outcome == "completed"]
        per_fault.append({
            "fault": fault["fault"], "at_s": round(t0, 2),
            "restored_after_s": (round(fault["restored_after_s"], 2)
                                 if fault.get("restored_after_s") is not None else None),
            "recovery_s": rec,
            "recovered_within_target": rec is not None and rec <= target_recovery_s,
            "requests_ended_until_next_fault": outcome_counts(ended),
            "latency_of_those_completed_s": {
                "p50": round(median(done_after), 2) if done_after else None,
                "max": round(max(done_after), 2) if done_after else None},
            "details": fault.get("details", {}),
        })
    return {
        "sent": len(load),
        "accepted": accepted,
        **{name: counts[name] for name in OUTCOMES},
        "cut_by_crash_retries": dict(retries),
        "cut_by_crash_retry_details": [
            {"request": r.name, **({"outcome": r.retry.outcome, "attempts": r.retry.attempts,
                                    "conflicts_409": r.retry.conflicts,
                                    "seconds": round(r.retry.seconds, 2),
                                    "detail": r.retry.detail} if r.retry else {})}
            for r in cut],
        "baseline_p50_latency_s": round(base, 3) if base is not None else None,
        "recovery_s": {f["fault"]: f["recovery_s"] for f in per_fault},
        "faults": per_fault,
        "lost_examples": [_example(r) for r in load if r.outcome == "lost"][:20],
        # Every load request: [name, sent at s, ended at s, outcome, HTTP status, first token s]
        "timeline": [[r.name, round(r.start, 2), round(r.end, 2), r.outcome, r.status,
                      round(r.first_token - r.start, 2) if r.first_token >= 0 else None]
                     for r in sorted(load, key=lambda r: r.start)],
        "failed_with_error_kinds": dict(Counter(
            f"{r.status or 'sse'} {r.error_code}".strip() for r in load
            if r.outcome == "failed_with_error")),
    }


def _example(r) -> dict:
    return {"request": r.name, "start_s": round(r.start, 2), "end_s": round(r.end, 2),
            "status": r.status, "detail": r.detail}
