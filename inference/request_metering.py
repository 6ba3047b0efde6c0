"""Metering one request: its pending usage event, and every token the replicas computed for it.

`computed_tokens` sums the request's attempts (one per replica it was streamed from): an
attempt that got its final chunk counts that chunk's numbers; one that ended without it (the
client went away, the stream broke) asks the replica's usage ledger, with abort (the replica
stops the request) and a bounded wait for its end, so a request cancelled before its first
token is charged the prompt tokens the replica prefilled. When the replica cannot say, what
this process saw streamed is billed (a lower bound). See docs/billing.md.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from billing.events import UsageEvent
from billing.models import UsageRecord
from inference.request import PreparedRequest
from inference.replica_client import ReplicaChunk, ReplicaClient, ReplicaError, ReplicaUsage

logger = logging.getLogger(__name__)


@dataclass
class Attempt:
    """One replica's stream for this request: what it reported."""

    address: str
    model_name: str  # the model's name in the replica's Triton repository
    final: ReplicaChunk | None = None
    last: ReplicaChunk | None = None
    rejected: bool = False  # refused before the engine: nothing computed


@dataclass(frozen=True)
class Tokens:
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: "Tokens") -> "Tokens":
        return Tokens(self.input_tokens + other.input_tokens,
                      self.cached_tokens + other.cached_tokens,
                      self.output_tokens + other.output_tokens)

    @classmethod
    def of(cls, report: ReplicaChunk | ReplicaUsage | None) -> "Tokens":
        if report is None:
            return cls()
        if isinstance(report, ReplicaUsage):
            return cls(report.input_tokens, report.cached_tokens, report.output_tokens)
        return cls(report.num_input_tokens, report.num_cached_tokens, report.num_output_tokens)


def pending_event(prepared: PreparedRequest) -> UsageEvent:
    """What admission records: no tokens yet, the estimate the token bucket was charged."""
    return UsageEvent(
        request_id=prepared.request_id, tenant_id=prepared.principal.tenant_id,
        api_key_id=prepared.principal.api_key_id, model_name=prepared.target.model_name,
        model_version_id=prepared.target.model_version_id, replica_id=None, input_tokens=0,
        cached_tokens=0, output_tokens=0, ttft_ms=None, total_ms=0.0,
        status=UsageRecord.Status.PENDING, endpoint=prepared.request.endpoint,
        estimated_tokens=prepared.charge.estimated_tokens)


async def computed_tokens(client: ReplicaClient, request_id: str, attempts: list[Attempt],
                          wait_s: float) -> Tokens:
    total = Tokens()
    unsettled: dict[tuple[str, str], list[Attempt]] = {}
    for attempt in attempts:
        if attempt.final is not None:
            total += Tokens.of(attempt.final)
        elif not attempt.rejected:
            unsettled.setdefault((attempt.address, attempt.model_name), []).append(attempt)
    for (address, model_name), on_replica in unsettled.items():
        streamed = sum((Tokens.of(a.last) for a in on_replica), Tokens())
        try:
            usage = (await asyncio.wait_for(
                client.usage(address, model_name, [request_id], abort=True, wait_s=wait_s),
                wait_s + 2.0))[request_id]
        except (ReplicaError, asyncio.TimeoutError, OSError) as exc:
            logger.warning("replica %s could not say what %s computed (%s); billing what was "
                           "streamed", address, request_id, exc)
            total += streamed
            continue
        if usage.state != "finished":
            logger.warning("replica %s reports %s for %s after %.1f s; billing what was streamed",
                           address, usage.state, request_id, wait_s)
            total += streamed
            continue
        total += Tokens.of(usage)
    return total
