"""Running one prepared request: admit -> route and stream (retry, canary fallback) -> finish.

    Generation.generate(prepared):
        open the usage (lease, pending event)
        loop: admit (a slot in the model's queue)           -> Admission
              route and stream (a replica; retry before the first token) -> Delta ...
              a canary that cannot start it: fall back to stable (VersionChooser.fall_back)
        finish (release, Idempotency-Key, settle the bucket, usage event)

Each step is a method of `Generation` with the collaborators it was built with (wired once per
event loop in inference/container.py); `StreamOutcome` is what the stream reports to finish.

`Generation.generate(prepared)` is an async iterator of `Delta`s then one `Done`. It raises
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
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from billing.leases import UsageLease
from billing.models import UsageRecord
from billing.services import UsageEvent, queue_pending_usage, record_usage
from inference.admission import AdmissionQueue, QueueFull, QueueTimeout, Slot, Waiter
from inference.canary import VersionChooser
from inference.db_connection import release_db_connection
from inference.errors import (
    InvalidRequest,
    ModelFailed,
    ReplicaDied,
    ReplicaFailed,
    ServiceUnavailable,
)
from inference.idempotency import IdempotencyStore
from inference.keepalive import KeepAlive
from inference.observability.generation_metrics import observe_generation
from inference.prefix_index import prompt_block_hashes
from inference.replica_client import (
    ReplicaChunk,
    ReplicaClient,
    ReplicaDead,
    ReplicaRejected,
    ReplicaRequest,
    ReplicaRequestFailed,
    ReplicaStreamError,
    ReplicaUnavailable,
)
from inference.request import Delta, Done, PreparedRequest, Result
from inference.request_metering import (Attempt, Ending, Tokens, computed_tokens, end_request,
                                        pending_event)
from inference.router import Lease, NoReplicaReady, Prefetch, RouteRequest, Router
from llm_platform.hot_settings import settings
from models_registry.selectors import can_cold_start
from tenants.buckets import TokenBuckets

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Admission:
    """The admit step's answer: a slot in the model's queue (None: no replica is ready and none
    is coming, so routing answers 503), when it was granted, and the routing snapshot read on
    the admission's round trip (None when the request waited in the queue: it is stale then)."""

    slot: Slot | None
    admitted_at: float
    prefetch: Prefetch | None = None


@dataclass
class StreamOutcome:
    """What routing and streaming saw, filled in as they go; `finish` bills and records it."""

    started: float
    deltas: list[str] = field(default_factory=list)
    first_token_at: float | None = None
    replica_id: int | None = None
    final: ReplicaChunk | None = None
    status: str = UsageRecord.Status.FAILED
    attempts: list[Attempt] = field(default_factory=list)
    admitted_at: float | None = None  # when the (last) admission slot was granted
    served: Lease | None = None  # the router lease of the replica that sent the final chunk


def route_request(prepared: PreparedRequest) -> RouteRequest:
    return RouteRequest(prepared.principal.tenant_id, len(prepared.prompt_token_ids),
                        prepared.max_tokens,
                        block_hashes=prompt_block_hashes(prepared.prompt_token_ids,
                                                         str(prepared.principal.tenant_id),
                                                         settings.ROUTER_PREFIX_MAX_BLOCKS))


def replica_request(prepared: PreparedRequest) -> ReplicaRequest:
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


async def _bounded(step, what: str, request_id: str) -> None:
    """One cleanup step, shielded from cancellation and bounded in time; a failure is logged
    (what it would have released expires by itself)."""
    try:
        await asyncio.wait_for(asyncio.shield(step), settings.CLEANUP_STEP_TIMEOUT_SECONDS)
    except Exception as exc:  # noqa: BLE001 - never fail or hang a request in its cleanup
        logger.warning("%s failed for %s: %r", what, request_id, exc)


async def _report(outcome) -> None:
    """Tell the router how a replica did (circuit, prefix index, counters): a Redis hiccup
    there must not fail a request the replica is serving."""
    try:
        await outcome
    except Exception:  # noqa: BLE001
        logger.exception("routing outcome not recorded")


class Generation:
    def __init__(self, *, admission: AdmissionQueue, router: Router,
                 replica_client: ReplicaClient, versions: VersionChooser,
                 idempotency: IdempotencyStore, buckets: TokenBuckets, redis, key_prefix: str,
                 clock: Callable[[], float]):
        self._admission = admission
        self._router = router
        self._replicas = replica_client
        self._versions = versions  # the canary's fallback to stable
        self._idempotency = idempotency
        self._buckets = buckets
        self._redis = redis  # usage leases (billing.leases)
        self._key_prefix = key_prefix
        self._clock = clock

    async def generate(self, prepared: PreparedRequest) -> AsyncIterator[Delta | Done]:
        outcome = StreamOutcome(started=self._clock())
        result: Result | None = None
        slot: Slot | None = None
        current = prepared  # becomes the stable version if a canary cannot serve the request
        keepalive = KeepAlive(settings.REQUEST_KEEPALIVE_SECONDS,
                              settings.CLEANUP_STEP_TIMEOUT_SECONDS,
                              max_s=settings.REQUEST_DEADLINE_SECONDS + 60)
        if prepared.claim is not None:
            claim = prepared.claim
            keepalive.hold("idempotency", lambda: self._idempotency.refresh(claim))
        usage_lease = UsageLease(self._redis, self._key_prefix, prepared.request_id,
                                 settings.BILLING_LEASE_TTL_SECONDS)
        opened = False
        prefetch: Prefetch | None = None

        def open_usage(pipe):  # the usage lease and pending event ride on the admission call
            nonlocal opened
            opened = True
            return queue_pending_usage(pipe, pending_event(prepared), usage_lease)

        try:
            while True:
                tried: set[int] = set()
                try:
                    route = route_request(current)
                    try:
                        admission = await self._admit(current, None if opened else open_usage,
                                                      route)
                    finally:
                        if not opened:  # no admission call (no replica), or it failed before
                            opened = True
                            await _open_usage(prepared, usage_lease)
                    if prefetch is not None:
                        prefetch.close()
                    prefetch = admission.prefetch
                    slot = admission.slot
                    if slot is not None:
                        keepalive.hold("slot", slot.refresh)
                    outcome.admitted_at = admission.admitted_at
                    # aclosing: a client that goes away closes the replica's stream at once.
                    async with aclosing(self._stream(current, outcome, tried, keepalive, route,
                                                     prefetch)) as deltas:
                        async for delta in deltas:
                            yield delta
                    break
                except (ServiceUnavailable, ReplicaFailed) as exc:
                    # A canary that cannot start the request never fails it: stable serves it
                    # (unless the canary's engine died serving it: it may be what killed it).
                    if (current.fallback is None or outcome.first_token_at is not None
                            or isinstance(exc, ReplicaDied)):
                        raise
                    keepalive.drop("slot")
                    slot = await _release_slot(slot, current)
                    outcome.replica_id = None
                    current = await self._versions.fall_back(
                        current, failed=isinstance(exc, ReplicaFailed))
            outcome.status = UsageRecord.Status.OK
            final = outcome.final
            result = Result(
                id=current.request_id,
                created=int(time.time()),
                model=current.target.model_name,
                deltas=outcome.deltas,
                finish_reason=final.finish_reason or "stop",
                input_tokens=final.num_input_tokens or len(current.prompt_token_ids),
                output_tokens=final.num_output_tokens,
                cached_tokens=final.num_cached_tokens,
            )
            yield Done(result)
        except (asyncio.CancelledError, GeneratorExit):
            if outcome.status != UsageRecord.Status.OK:
                outcome.status = UsageRecord.Status.CANCELLED
            raise
        finally:
            if prefetch is not None:  # acquire closes it; a request that never got there
                prefetch.close()
            # Shielded: a second cancellation must not lose the usage row or the key's state.
            await asyncio.shield(self._finish(current, outcome, result, slot, keepalive,
                                              usage_lease))

    async def _admit(self, prepared: PreparedRequest, also=None,
                     route: RouteRequest | None = None) -> Admission:
        """A slot of the model version in its model's admission queue (one per model, shared by
        its versions); no slot when no replica is ready (routing then answers 503). Raises 503
        when the queue is full or the tier's wait bound passes. `also(pipe)` queues more
        commands on the admission's round trip (the usage lease and pending event); `route`:
        the router's snapshot for it is read on that round trip too (`Admission.prefetch`)."""
        model_version_id = prepared.target.model_version_id
        router = self._router
        ready = await router.ready(model_version_id)
        num_ready = len(ready)
        # No replica ready, but one is loading or the version scales from zero: wait for it in
        # the queue (the autoscaler sees the depth and starts one) rather than refuse.
        cold = num_ready == 0 and await can_cold_start(model_version_id)
        if num_ready == 0 and not cold:
            return Admission(None, self._clock())
        limits = prepared.charge.limits
        max_wait_s = limits.max_queue_wait_ms / 1000.0
        if cold:
            max_wait_s = max(max_wait_s, settings.COLD_START_MAX_WAIT_SECONDS)
        waiter = Waiter(tenant=str(limits.tenant_id), priority=limits.priority,
                        cost_tokens=prepared.charge.estimated_tokens, max_wait_s=max_wait_s)

        async def capacity() -> tuple[int, int]:
            n = await router.num_ready(model_version_id)
            await release_db_connection()
            return (n * settings.ADMISSION_SLOTS_PER_REPLICA,
                    n * settings.ADMISSION_HEADROOM_SLOTS_PER_REPLICA)

        await release_db_connection()  # not held while waiting (prepare and num_ready read it)
        prefetch: Prefetch | None = None

        def with_snapshot(pipe):
            nonlocal prefetch
            parts = []
            if also is not None:
                start = len(pipe.command_stack)
                finish = also(pipe)
                parts.append((start, len(pipe.command_stack), finish))
            start = len(pipe.command_stack)
            prefetch = router.queue_snapshot(pipe, model_version_id, ready, route,
                                             prepared.target.routing_policy)
            parts.append((start, len(pipe.command_stack), prefetch.finish))
            total = len(pipe.command_stack)

            async def finish_all(results: list) -> None:
                failed = len(results) != total  # [the exception that failed the call]
                for first, end, finish in parts:
                    await finish(results if failed else results[first:end])
            return finish_all

        try:
            try:
                slot = await self._admission.admit(
                    prepared.target.model_name, model_version_id, waiter,
                    capacity=num_ready * settings.ADMISSION_SLOTS_PER_REPLICA,
                    headroom=num_ready * settings.ADMISSION_HEADROOM_SLOTS_PER_REPLICA,
                    refresh=capacity if cold else None,
                    also=with_snapshot if route is not None and ready else also,
                    on_wait=lambda: prefetch is not None and prefetch.close())
            except BaseException:
                if prefetch is not None:
                    prefetch.close()
                raise
        except QueueFull:
            raise ServiceUnavailable(
                f"'{prepared.target.model_name}' is at capacity and its queue is full; retry "
                "later.", code="queue_full",
                headers={"Retry-After": str(settings.ADMISSION_FULL_RETRY_AFTER_SECONDS)},
            ) from None
        except QueueTimeout:
            raise ServiceUnavailable(
                f"'{prepared.target.model_name}' is at capacity: no slot within your tier's "
                f"{limits.max_queue_wait_ms} ms wait bound; retry later.", code="queue_timeout",
                headers={"Retry-After": str(max(1, math.ceil(limits.max_queue_wait_ms / 1000)))},
            ) from None
        if slot.queued:  # read before the wait: stale now (closed when the wait began, so
            prefetch = None  # that it holds no in-flight decision of the router meanwhile)
        return Admission(slot, self._clock(), prefetch)

    async def _stream(self, prepared: PreparedRequest, outcome: StreamOutcome, tried: set[int],
                      keepalive: KeepAlive, route: RouteRequest,
                      prefetch: Prefetch | None = None) -> AsyncIterator[Delta]:
        """Stream from a ready replica of `prepared.target` until the final chunk (in
        `outcome.final`); a replica failing before the first token is retried on another (at
        most ROUTER_MAX_ATTEMPTS); each outcome is reported to the router (circuit, prefix
        index). `prefetch`: the first decision's snapshot, read with the admission."""
        clock, router = self._clock, self._router
        request = replica_request(prepared)
        while True:
            try:
                lease = await router.acquire(
                    prepared.target.model_version_id, prepared.target.routing_policy, route,
                    exclude=frozenset(tried), prefetch=prefetch)
                prefetch = None  # a retry reads its own
            except NoReplicaReady as exc:
                if tried or exc.failing:  # the replicas fail: not a capacity answer
                    raise ReplicaFailed(
                        "Every replica tried failed before the first token; retry later."
                        if tried else f"Every ready replica of '{prepared.target.model_name}' "
                        "is failing; retry later.", headers={"Retry-After": "1"}) from None
                raise ServiceUnavailable(
                    f"No replica of '{prepared.target.model_name}' is ready; retry later.",
                    headers={"Retry-After": str(settings.NO_REPLICA_RETRY_AFTER_SECONDS)},
                ) from None
            tried.add(lease.replica.replica_id)
            outcome.replica_id = lease.replica.replica_id
            keepalive.hold("lease", lease.refresh)
            attempt = Attempt(lease.replica.grpc_address, request.model_name)
            outcome.attempts.append(attempt)
            try:
                await release_db_connection()  # not held while streaming
                async with aclosing(
                    self._replicas.stream(lease.replica.grpc_address, request)
                ) as chunks:
                    async for chunk in chunks:
                        attempt.last = chunk
                        first = outcome.first_token_at is None
                        if first:
                            outcome.first_token_at = clock()
                        if chunk.text:
                            outcome.deltas.append(chunk.text)
                            yield Delta(chunk.text)
                        if first:  # after the first token left: not on its way (TTFT)
                            # Best effort: the lease gives back the rest (or expires) at the end.
                            # A first chunk that is also the last (a one-token reply) gives
                            # back nothing early: the request's end, next, returns the whole
                            # lease in its one round trip (end_request).
                            if not chunk.final:
                                await _report(lease.release_prompt())
                            await _report(router.first_token(lease))
                        if chunk.final:
                            outcome.final = attempt.final = chunk
                            break
            except ReplicaRejected as exc:
                attempt.rejected = True
                outcome.status = UsageRecord.Status.REJECTED
                raise InvalidRequest(str(exc) or "The replica refused the request.") from exc
            except ReplicaRequestFailed as exc:
                raise ModelFailed(f"The model failed on this request: {exc}") from exc
            except ReplicaDead as exc:
                await asyncio.shield(_report(router.dead(lease, str(exc))))
                logger.error("replica %s: engine dead (%s)", lease.replica.grpc_address, exc)
                if exc.in_flight or outcome.first_token_at is not None:
                    raise ReplicaDied("The replica serving this request failed; retry later.",
                                      headers={"Retry-After": "1"}) from exc
                if len(tried) >= settings.ROUTER_MAX_ATTEMPTS:
                    raise ReplicaFailed("The replicas failed before the first token; retry "
                                        "later.", headers={"Retry-After": "1"}) from exc
                continue
            except (ReplicaUnavailable, ReplicaStreamError) as exc:
                started = outcome.first_token_at is not None
                retrying = not started and len(tried) < settings.ROUTER_MAX_ATTEMPTS
                await asyncio.shield(_report(router.failed(
                    lease, before_first_token=not started, retrying=retrying)))
                if started:
                    # The usage row records it: status failed, the tokens streamed so far.
                    raise ReplicaFailed(f"The replica failed mid-stream: {exc}") from exc
                logger.warning("replica %s failed before the first token: %s",
                               lease.replica.grpc_address, exc)
                if not retrying:
                    raise ReplicaFailed("The replicas failed before the first token; retry "
                                        "later.", headers={"Retry-After": "1"}) from exc
                continue
            finally:
                keepalive.drop("lease")
                if outcome.final is None:
                    await _bounded(lease.release(), "lease release", prepared.request_id)
                else:  # released with the rest of the request's end (`end_request`)
                    outcome.served = lease
            if outcome.final is None:
                raise ReplicaFailed("The replica ended the stream without a final response.")
            return

    async def _finish(self, prepared: PreparedRequest, outcome: StreamOutcome,
                      result: Result | None, slot: Slot | None, keepalive: KeepAlive,
                      usage_lease: UsageLease) -> None:
        await keepalive.stop()
        if prepared.claim is not None:  # on failure the pending key expires (its TTL)
            if result is not None:
                step = self._idempotency.complete(prepared.claim, result.to_dict())
            else:
                step = self._idempotency.abandon(prepared.claim)
            await _bounded(step, "idempotency bookkeeping", prepared.request_id)
        tokens = await computed_tokens(self._replicas, prepared.request_id, outcome.attempts,
                                       settings.BILLING_REPLICA_USAGE_WAIT_SECONDS)
        event = _usage_event(prepared, outcome, tokens, self._clock())
        observe_generation(prepared, event, outcome.started, outcome.admitted_at)
        # One round trip: router lease, routing counters, slot, token bucket (charged what it
        # used, whatever the end), the final usage event, the usage lease.
        await end_request(self._redis, self._router, self._buckets,
                          Ending(prepared, event, usage_lease, slot, outcome.served,
                                 outcome.final),
                          settings.CLEANUP_STEP_TIMEOUT_SECONDS)


async def _open_usage(prepared: PreparedRequest, usage_lease: UsageLease) -> None:
    """The usage lease, then the pending usage event: from here on the request is billed even
    if this process dies (the reaper finalises it)."""
    try:  # one round trip: the lease's SET, then the event
        await record_usage(pending_event(prepared), lease=usage_lease)
    except Exception:  # noqa: BLE001 - the final event still bills it
        logger.exception("pending usage for %s was not recorded", prepared.request_id)
    usage_lease.keep()


async def _release_slot(slot: Slot | None, prepared: PreparedRequest) -> None:
    if slot is not None:  # on failure the slot's lease expires (ADMISSION_SLOT_TTL_SECONDS)
        await _bounded(slot.release(), "admission slot release", prepared.request_id)
    return None


def _usage_event(prepared: PreparedRequest, outcome: StreamOutcome, tokens: Tokens,
                 now: float) -> UsageEvent:
    return UsageEvent(
        request_id=prepared.request_id,
        tenant_id=prepared.principal.tenant_id,
        api_key_id=prepared.principal.api_key_id,
        model_name=prepared.target.model_name,
        model_version_id=prepared.target.model_version_id,
        replica_id=outcome.replica_id,
        input_tokens=tokens.input_tokens,
        cached_tokens=tokens.cached_tokens,
        output_tokens=tokens.output_tokens,
        ttft_ms=None if outcome.first_token_at is None
        else (outcome.first_token_at - outcome.started) * 1000.0,
        total_ms=(now - outcome.started) * 1000.0,
        status=outcome.status,
        finish_reason=(outcome.final.finish_reason if outcome.final else ""),
        endpoint=prepared.request.endpoint,
        estimated_tokens=prepared.charge.estimated_tokens,
    )
