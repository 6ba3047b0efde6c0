"""Running one prepared request: route, stream from the replica, retry, account, record.

`generate(container, prepared)` is an async iterator of `Delta`s then one `Done`. It raises
ApiError subclasses for failures the client must see; a replica failure before the first token
is retried on another ready replica (at most settings.ROUTER_MAX_ATTEMPTS replicas). Never
retried: input the replica refused (400), a request that failed alone inside a working replica
(500 model_error) and a request in flight when its replica's engine died (503; the replica is
dropped from routing at once and marked failed). A request refused by an already dead engine is
retried elsewhere. Whatever happens (finish, error, client disconnect, Redis or PostgreSQL
failing) the admission slot and the replica lease are released, one usage row is recorded and the
Idempotency-Key is either completed with the reply or abandoned. While the request runs, a
KeepAlive refreshes the slot, the lease and the pending key (all expiring leases in Redis); each
release step waits at most settings.CLEANUP_STEP_TIMEOUT_SECONDS, and whatever a failing Redis
kept is reclaimed when its lease expires (settings.ADMISSION_SLOT_TTL_SECONDS,
IDEMPOTENCY_PENDING_TTL_SECONDS).

Metering (docs/billing.md): before anything else the request takes its usage lease and sends a
pending usage event (both in the round trip that enters the admission queue; on their own when
no admission call is made); at the end it sends the final one, with every token the replicas computed
for it: the final chunk's counts, or, for an attempt that ended without one (client gone,
stream broken), the replica's own usage ledger, asked with abort (so a cancelled request is
charged the prompt tokens the replica prefilled). The token bucket is corrected with the same
count; the usage lease goes only once the final event is durable.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from contextlib import aclosing
from dataclasses import asdict, dataclass, field
from typing import AsyncIterator

from django.conf import settings

from billing.leases import UsageLease
from billing.models import UsageRecord
from billing.services import UsageEvent, queue_pending_usage, record_usage
from inference.admission import QueueFull, QueueTimeout, Slot, Waiter
from inference.container import Container
from inference.db_connection import release_db_connection
from inference.errors import InvalidRequest, ModelFailed, ReplicaDied, ReplicaFailed, ServiceUnavailable
from inference.keepalive import KeepAlive
from inference.observability.generation_metrics import observe_generation
from inference.pipeline import Prepared, record_fallback, retarget
from inference.quota import settle
from inference.replica_client import (
    ReplicaChunk,
    ReplicaDead,
    ReplicaRejected,
    ReplicaRequest,
    ReplicaRequestFailed,
    ReplicaStreamError,
    ReplicaUnavailable,
)
from inference.request_metering import Attempt, Tokens, computed_tokens, pending_event
from inference.prefix_index import prompt_block_hashes
from inference.router import NoReplicaReady, RouteRequest
from models_registry.selectors import can_cold_start
from inference.fallbacks import FAILED, UNAVAILABLE

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Delta:
    text: str


@dataclass
class Result:
    """The reply, in a form every response format renders and the idempotency store keeps."""

    id: str
    created: int
    model: str
    deltas: list[str]
    finish_reason: str
    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0

    @property
    def text(self) -> str:
        return "".join(self.deltas)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Result":
        return cls(**data)


@dataclass(frozen=True)
class Done:
    result: Result


@dataclass
class _Progress:
    started: float
    deltas: list[str] = field(default_factory=list)
    first_token_at: float | None = None
    replica_id: int | None = None
    final: ReplicaChunk | None = None
    last: ReplicaChunk | None = None
    status: str = UsageRecord.Status.FAILED
    attempts: list[Attempt] = field(default_factory=list)
    admitted_at: float | None = None  # when the (last) admission slot was granted


def replica_request(prepared: Prepared) -> ReplicaRequest:
    sampling = prepared.request.sampling
    return ReplicaRequest(
        request_id=prepared.request_id,
        model_name=prepared.target.model_name,
        prompt_text=prepared.prompt_text,
        prompt_token_ids=prepared.prompt_token_ids,
        max_tokens=prepared.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=sampling.seed,
        stop=sampling.stop,
        priority=prepared.charge.limits.priority,
        # ENGINE_FAIR_SHARE off (a benchmark baseline): one fair-share unit for everybody.
        tenant=str(prepared.principal.tenant_id) if settings.ENGINE_FAIR_SHARE else "shared",
        cache_salt=str(prepared.principal.tenant_id),
    )


async def _admit(container: Container, prepared: Prepared, also=None) -> Slot | None:
    """A slot of the model version in its model's admission queue (one per model, shared by
    its versions); None when no replica is ready (the router then answers 503). Raises 503 when
    the queue is full or the tier's wait bound passes."""
    model_version_id = prepared.target.model_version_id
    num_ready = await container.router.num_ready(model_version_id)
    # No replica ready, but one is loading or the version scales from zero: wait for it in the
    # queue (the autoscaler sees the depth and starts one) rather than refuse.
    cold = num_ready == 0 and await can_cold_start(model_version_id)
    if num_ready == 0 and not cold:
        return None
    limits = prepared.charge.limits
    max_wait_s = limits.max_queue_wait_ms / 1000.0
    if cold:
        max_wait_s = max(max_wait_s, settings.COLD_START_MAX_WAIT_SECONDS)
    waiter = Waiter(tenant=str(limits.tenant_id), priority=limits.priority,
                    cost_tokens=prepared.charge.estimated_tokens, max_wait_s=max_wait_s)

    async def capacity() -> tuple[int, int]:
        n = await container.router.num_ready(model_version_id)
        await release_db_connection()
        return (n * settings.ADMISSION_SLOTS_PER_REPLICA,
                n * settings.ADMISSION_HEADROOM_SLOTS_PER_REPLICA)

    await release_db_connection()  # not held while waiting (prepare and num_ready read it)
    try:
        return await container.admission.admit(
            prepared.target.model_name, model_version_id, waiter,
            capacity=num_ready * settings.ADMISSION_SLOTS_PER_REPLICA,
            headroom=num_ready * settings.ADMISSION_HEADROOM_SLOTS_PER_REPLICA,
            refresh=capacity if cold else None, also=also)
    except QueueFull:
        raise ServiceUnavailable(
            f"'{prepared.target.model_name}' is at capacity and its queue is full; retry later.",
            code="queue_full",
            headers={"Retry-After": str(settings.ADMISSION_FULL_RETRY_AFTER_SECONDS)}) from None
    except QueueTimeout:
        raise ServiceUnavailable(
            f"'{prepared.target.model_name}' is at capacity: no slot within your tier's "
            f"{limits.max_queue_wait_ms} ms wait bound; retry later.", code="queue_timeout",
            headers={"Retry-After": str(max(1, math.ceil(limits.max_queue_wait_ms / 1000)))},
        ) from None


async def _bounded(step, what: str, request_id: str) -> None:
    """One cleanup step, shielded from cancellation and bounded in time; a failure is logged
    (what it would have released expires by itself)."""
    try:
        await asyncio.wait_for(asyncio.shield(step), settings.CLEANUP_STEP_TIMEOUT_SECONDS)
    except Exception as exc:  # noqa: BLE001 - never fail or hang a request in its cleanup
        logger.warning("%s failed for %s: %r", what, request_id, exc)


async def generate(container: Container, prepared: Prepared) -> AsyncIterator[Delta | Done]:
    clock = container.clock
    progress = _Progress(started=clock())
    result: Result | None = None
    slot: Slot | None = None
    current = prepared  # becomes the stable version if a canary cannot serve the request
    keepalive = KeepAlive(settings.REQUEST_KEEPALIVE_SECONDS,
                          settings.CLEANUP_STEP_TIMEOUT_SECONDS,
                          max_s=settings.REQUEST_DEADLINE_SECONDS + 60)
    if prepared.claim is not None:
        claim = prepared.claim
        keepalive.hold("idempotency", lambda: container.idempotency.refresh(claim))
    usage_lease = UsageLease(container.redis, container.key_prefix, prepared.request_id,
                             settings.BILLING_LEASE_TTL_SECONDS)
    opened = False

    def open_usage(pipe):  # the usage lease and pending event ride on the admission call
        nonlocal opened
        opened = True
        return queue_pending_usage(pipe, pending_event(prepared), usage_lease)

    try:
        while True:
            tried: set[int] = set()
            try:
                try:
                    slot = await _admit(container, current, None if opened else open_usage)
                finally:
                    if not opened:  # no admission call (no replica), or it failed before
                        opened = True
                        await _open_usage(prepared, usage_lease)
                if slot is not None:
                    keepalive.hold("slot", slot.refresh)
                progress.admitted_at = clock()
                # aclosing: a client that goes away closes the replica's stream at once.
                async with aclosing(_stream(container, current, progress, tried,
                                            keepalive)) as deltas:
                    async for delta in deltas:
                        yield delta
                break
            except (ServiceUnavailable, ReplicaFailed) as exc:
                # A canary that cannot start the request never fails it: stable serves it
                # (unless the canary's engine died serving it: it may be what killed it).
                if (current.fallback is None or progress.first_token_at is not None
                        or isinstance(exc, ReplicaDied)):
                    raise
                keepalive.drop("slot")
                slot = await _release_slot(slot, current)
                await record_fallback(container, current.rollout_id, FAILED if tried else UNAVAILABLE)
                logger.warning("canary %s of rollout %s could not serve %s; falling back to "
                               "stable", current.target.model_version_id, current.rollout_id,
                               current.request_id)
                progress.replica_id = None
                progress.last = None
                current = await retarget(container, current)
        progress.status = UsageRecord.Status.OK
        final = progress.final
        result = Result(
            id=current.request_id,
            created=int(time.time()),
            model=current.target.model_name,
            deltas=progress.deltas,
            finish_reason=final.finish_reason or "stop",
            input_tokens=final.num_input_tokens or len(current.prompt_token_ids),
            output_tokens=final.num_output_tokens,
            cached_tokens=final.num_cached_tokens,
        )
        yield Done(result)
    except (asyncio.CancelledError, GeneratorExit):
        if progress.status != UsageRecord.Status.OK:
            progress.status = UsageRecord.Status.CANCELLED
        raise
    finally:
        # Shielded: a second cancellation must not lose the usage row or the key's state.
        await asyncio.shield(_finish(container, current, progress, result, slot, keepalive,
                                     usage_lease))


async def _open_usage(prepared: Prepared, usage_lease: UsageLease) -> None:
    """The usage lease, then the pending usage event: from here on the request is billed even
    if this process dies (the reaper finalises it)."""
    try:  # one round trip: the lease's SET, then the event
        await record_usage(pending_event(prepared), lease=usage_lease)
    except Exception:  # noqa: BLE001 - the final event still bills it
        logger.exception("pending usage for %s was not recorded", prepared.request_id)
    usage_lease.keep()


async def _report(outcome) -> None:
    """Tell the router how a replica did (circuit, prefix index, counters): a Redis hiccup
    there must not fail a request the replica is serving."""
    try:
        await outcome
    except Exception:  # noqa: BLE001
        logger.exception("routing outcome not recorded")


async def _stream(container: Container, prepared: Prepared, progress: _Progress,
                  tried: set[int], keepalive: KeepAlive) -> AsyncIterator[Delta]:
    """Stream from a ready replica of `prepared.target` until the final chunk (in
    `progress.final`); a replica failing before the first token is retried on another (at most
    ROUTER_MAX_ATTEMPTS); each outcome is reported to the router (circuit, prefix index)."""
    clock = container.clock
    request = replica_request(prepared)
    route = RouteRequest(prepared.principal.tenant_id, len(prepared.prompt_token_ids),
                         prepared.max_tokens,
                         block_hashes=prompt_block_hashes(prepared.prompt_token_ids,
                                                          request.cache_salt,
                                                          settings.ROUTER_PREFIX_MAX_BLOCKS))
    while True:
        try:
            lease = await container.router.acquire(
                prepared.target.model_version_id, prepared.target.routing_policy, route,
                exclude=frozenset(tried))
        except NoReplicaReady:
            if tried:
                raise ReplicaFailed("Every replica tried failed before the first token; "
                                    "retry later.",
                                    headers={"Retry-After": "1"}) from None
            raise ServiceUnavailable(
                f"No replica of '{prepared.target.model_name}' is ready; retry later.",
                headers={"Retry-After": str(settings.NO_REPLICA_RETRY_AFTER_SECONDS)},
            ) from None
        tried.add(lease.replica.replica_id)
        progress.replica_id = lease.replica.replica_id
        keepalive.hold("lease", lease.refresh)
        attempt = Attempt(lease.replica.grpc_address, request.model_name)
        progress.attempts.append(attempt)
        try:
            await release_db_connection()  # not held while streaming
            async with aclosing(
                container.replica_client.stream(lease.replica.grpc_address, request)
            ) as chunks:
                async for chunk in chunks:
                    progress.last = attempt.last = chunk
                    if progress.first_token_at is None:
                        progress.first_token_at = clock()
                        # Best effort: the lease gives back the rest (or expires) at the end.
                        await _report(lease.release_prompt())
                        await _report(container.router.first_token(lease))
                    if chunk.text:
                        progress.deltas.append(chunk.text)
                        yield Delta(chunk.text)
                    if chunk.final:
                        progress.final = attempt.final = chunk
                        break
        except ReplicaRejected as exc:
            attempt.rejected = True
            progress.status = UsageRecord.Status.REJECTED
            raise InvalidRequest(str(exc) or "The replica refused the request.") from exc
        except ReplicaRequestFailed as exc:
            raise ModelFailed(f"The model failed on this request: {exc}") from exc
        except ReplicaDead as exc:
            await asyncio.shield(_report(container.router.dead(lease, str(exc))))
            logger.error("replica %s: engine dead (%s)", lease.replica.grpc_address, exc)
            if exc.in_flight or progress.first_token_at is not None:
                raise ReplicaDied("The replica serving this request failed; retry later.",
                                  headers={"Retry-After": "1"}) from exc
            if len(tried) >= settings.ROUTER_MAX_ATTEMPTS:
                raise ReplicaFailed("The replicas failed before the first token; retry later.",
                                    headers={"Retry-After": "1"}) from exc
            continue
        except (ReplicaUnavailable, ReplicaStreamError) as exc:
            started = progress.first_token_at is not None
            retrying = not started and len(tried) < settings.ROUTER_MAX_ATTEMPTS
            await asyncio.shield(_report(container.router.failed(
                lease, before_first_token=not started, retrying=retrying)))
            if started:
                # The usage row records it: status failed, the tokens streamed so far.
                raise ReplicaFailed(f"The replica failed mid-stream: {exc}") from exc
            logger.warning("replica %s failed before the first token: %s",
                           lease.replica.grpc_address, exc)
            if not retrying:
                raise ReplicaFailed("The replicas failed before the first token; retry later.",
                                    headers={"Retry-After": "1"}) from exc
            continue
        finally:
            keepalive.drop("lease")
            await _bounded(lease.release(), "lease release", prepared.request_id)
        if progress.final is None:
            raise ReplicaFailed("The replica ended the stream without a final response.")
        await _report(container.router.finished(
            lease, progress.final.num_input_tokens or len(prepared.prompt_token_ids),
            progress.final.num_cached_tokens))
        return


async def _release_slot(slot: Slot | None, prepared: Prepared) -> None:
    if slot is not None:  # on failure the slot's lease expires (ADMISSION_SLOT_TTL_SECONDS)
        await _bounded(slot.release(), "admission slot release", prepared.request_id)
    return None


async def _finish(container: Container, prepared: Prepared, progress: _Progress,
                  result: Result | None, slot: Slot | None, keepalive: KeepAlive,
                  usage_lease: UsageLease) -> None:
    await keepalive.stop()
    await _release_slot(slot, prepared)
    if prepared.claim is not None:  # on failure the pending key expires (its TTL)
        if result is not None:
            step = container.idempotency.complete(prepared.claim, result.to_dict())
        else:
            step = container.idempotency.abandon(prepared.claim)
        await _bounded(step, "idempotency bookkeeping", prepared.request_id)
    tokens = await computed_tokens(container.replica_client, prepared.request_id,
                                   progress.attempts, settings.BILLING_REPLICA_USAGE_WAIT_SECONDS)
    now = container.clock()
    event = _usage_event(prepared, progress, tokens, now)
    # Charged what it used, whatever the end (finished, failed, cancelled); on failure the
    # bucket keeps the estimate, which refills anyway.
    await _bounded(settle(container.buckets, prepared.charge,
                          event.input_tokens + event.output_tokens),
                   "quota correction", prepared.request_id)
    observe_generation(container, prepared, event, progress.started, progress.admitted_at)
    try:
        await record_usage(event)
    except Exception:  # noqa: BLE001 - the lease expires and the reaper finalises the row
        logger.exception("usage for %s was not recorded", prepared.request_id)
        usage_lease.abandon()
        return
    await usage_lease.release()


def _usage_event(prepared: Prepared, progress: _Progress, tokens: Tokens,
                 now: float) -> UsageEvent:
    return UsageEvent(
        request_id=prepared.request_id,
        tenant_id=prepared.principal.tenant_id,
        api_key_id=prepared.principal.api_key_id,
        model_name=prepared.target.model_name,
        model_version_id=prepared.target.model_version_id,
        replica_id=progress.replica_id,
        input_tokens=tokens.input_tokens,
        cached_tokens=tokens.cached_tokens,
        output_tokens=tokens.output_tokens,
        ttft_ms=None if progress.first_token_at is None
        else (progress.first_token_at - progress.started) * 1000.0,
        total_ms=(now - progress.started) * 1000.0,
        status=progress.status,
        finish_reason=(progress.final.finish_reason if progress.final else ""),
        endpoint=prepared.request.endpoint,
        estimated_tokens=prepared.charge.estimated_tokens,
    )
