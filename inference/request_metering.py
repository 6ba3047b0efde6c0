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
from billing.leases import UsageLease
from billing.models import UsageRecord
from billing.services import queue_final_usage
from common.pipelines import Batch
from inference.admission import Slot
from inference.request import PreparedRequest
from inference.quota import queue_settle
from inference.replica_client import ReplicaChunk, ReplicaClient, ReplicaError, ReplicaUsage
from inference.router import Lease, Router
from tenants.buckets import TokenBuckets

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


@dataclass
class Ending:
    """What a request gives back and records at its end (`end_request`)."""

    prepared: PreparedRequest
    event: UsageEvent  # the final usage event
    usage_lease: UsageLease
    slot: Slot | None  # its admission slot, if it still holds one
    served: Lease | None = None  # the router lease of the replica that sent the final chunk
    final: ReplicaChunk | None = None


async def end_request(redis, router: Router, buckets: TokenBuckets, ending: Ending,
                      timeout_s: float) -> None:
    """A request's end in one round trip (`common.pipelines.Batch`), in this order: the
    serving replica's router lease gives its tokens back and the routing counters count the
    request, the admission slot is freed (the pump hands it on), the token bucket is settled
    with what was used (finished, failed or cancelled alike), the final usage event goes to
    the stream and only then the usage lease is deleted (one script: exactly-once billing,
    docs/billing.md). Each part falls back on its own when Redis fails: the leases and the
    slot expire, the bucket keeps the estimate, the event goes to the outbox."""
    prepared, event = ending.prepared, ending.event
    batch = Batch(redis)
    if ending.served is not None and ending.final is not None:
        served, final = ending.served, ending.final
        batch.add(lambda b: router.queue_finished(
            b, served, final.num_input_tokens or len(prepared.prompt_token_ids),
            final.num_cached_tokens))
    if ending.slot is not None:
        batch.add(ending.slot.queue_release)
    batch.add(lambda b: queue_settle(b, buckets, prepared.charge,
                                     event.input_tokens + event.output_tokens))
    batch.add(lambda b: queue_final_usage(b, event, ending.usage_lease))
    await batch.execute(timeout_s)
