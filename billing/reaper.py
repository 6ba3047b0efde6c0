"""The usage reaper: finalises pending usage rows whose request's process is gone.

A pending row (written at admission) normally becomes final through the request's own final
event. When the process serving it died (SIGKILL, OOM, deploy) that event never comes: the
reaper finds the row (pending, older than `min_age_s`, lease gone: billing/leases.py), asks the
replicas of the row's model what they computed for that request id (their usage ledgers,
replica/backend/usage_ledger.py) and finalises the row with the sum, through `write_usage`.

Invariants:
- a row whose lease is held is never touched (its process is alive and will finalise it);
- a row is finalised only from replica answers in which no replica still runs the request and
  every replica answered; until `give_up_s` after admission, an unreachable replica makes the
  reaper wait for the next round. After that the row is finalised from what the answering
  replicas reported (a replica that is gone took its counters with it);
- finalising goes through `write_usage`, which changes pending rows only: the reaper racing the
  request's own (late) final event bills the request once. Both carry the replica's count.

The reaper lives in billing and asks replicas through `lookup`, which the caller passes in
(inference wires the Triton client: inference/usage_reaping.py).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable

from billing.events import UsageEvent
from billing.models import UsageRecord
from billing.services import write_usage

logger = logging.getLogger(__name__)

RUNNING, FINISHED, UNKNOWN, UNREACHABLE = "running", "finished", "unknown", "unreachable"


@dataclass(frozen=True)
class ReplicaCount:
    """One replica's answer for one request id."""

    state: str  # running | finished | unknown | unreachable
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = ""
    error: str = ""


# (model name, request ids) -> request id -> one answer per replica of that model asked
Lookup = Callable[[str, list[str]], dict[str, list[ReplicaCount]]]
HeldLeases = Callable[[list[str]], set[str]]


@dataclass
class ReapResult:
    finalised: int = 0
    waiting: int = 0  # still running somewhere, lease held, or a replica did not answer


def reap_pending_usage(now: datetime, lookup: Lookup, held: HeldLeases, *, min_age_s: float,
                       give_up_s: float, batch_size: int = 500) -> ReapResult:
    rows = list(UsageRecord.objects.filter(
        status=UsageRecord.Status.PENDING, created_at__lte=now - timedelta(seconds=min_age_s))
        .order_by("created_at")[:batch_size])
    result = ReapResult()
    alive = held([row.request_id for row in rows])
    orphans = [row for row in rows if row.request_id not in alive]
    result.waiting += len(rows) - len(orphans)
    by_model: dict[str, list[UsageRecord]] = {}
    for row in orphans:
        by_model.setdefault(row.model_name, []).append(row)
    events = []
    for model_name, model_rows in by_model.items():
        answers = lookup(model_name, [row.request_id for row in model_rows])
        for row in model_rows:
            given_up = (now - row.created_at).total_seconds() >= give_up_s
            event = final_event(row, answers.get(row.request_id, []), given_up)
            if event is None:
                result.waiting += 1
            else:
                events.append(event)
    if events:
        result.finalised = write_usage(events)
        logger.info("reaper finalised %d pending usage rows", result.finalised)
    return result


def final_event(row: UsageRecord, answers: list[ReplicaCount], given_up: bool) -> UsageEvent | None:
    """The row's final event from the replicas' answers, or None to wait for the next round."""
    if any(a.state == RUNNING for a in answers) and not given_up:
        return None
    if any(a.state == UNREACHABLE for a in answers) and not given_up:
        return None
    finished = [a for a in answers if a.state == FINISHED]
    if any(a.finish_reason in ("stop", "length") and not a.error for a in finished):
        status, reason = UsageRecord.Status.OK, next(
            a.finish_reason for a in finished if a.finish_reason in ("stop", "length"))
    elif not finished or any(a.error for a in finished):
        status, reason = UsageRecord.Status.FAILED, ""
    else:
        status, reason = UsageRecord.Status.CANCELLED, "abort"
    return UsageEvent(
        request_id=row.request_id, tenant_id=row.tenant_id, api_key_id=row.api_key_id,
        model_name=row.model_name, model_version_id=row.model_version_id,
        replica_id=row.replica_id,
        input_tokens=sum(a.input_tokens for a in finished),
        cached_tokens=sum(a.cached_tokens for a in finished),
        output_tokens=sum(a.output_tokens for a in finished),
        ttft_ms=None, total_ms=row.total_ms, status=status, finish_reason=reason,
        endpoint=row.endpoint, estimated_tokens=row.estimated_tokens,
        occurred_at=row.occurred_at.timestamp())
