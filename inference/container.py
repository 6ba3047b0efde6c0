"""The request path's collaborators, built once per event loop and injected into services.

Redis asyncio clients and gRPC channels belong to the loop that created them, so the
container is per loop; the tokenizer cache is per process. Both hang off the inference
AppConfig rather than module globals (`common.per_loop.PerLoop`); tests may replace
`InferenceConfig.containers.factory`.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable

import redis.asyncio as aioredis
from django.apps import apps
from django.conf import settings

from inference.admission import ADMISSION_POLICIES, AdmissionQueue
from inference.canary import RolloutCatalog
from inference.hooks import rollout_source
from inference.idempotency import IdempotencyStore
from inference.replica_client import ReplicaClient
from inference.circuit import CircuitBreaker
from inference.prefix_index import PrefixIndex
from inference.process_lease import ProcessLease
from inference.replica_signals import SignalPoller, SignalStore
from inference.router import (
    OutstandingTokens,
    ReplicaDirectory,
    Router,
    RoutingState,
    ServingCatalog,
)
from inference.routing_stats import RoutingStats
from inference.tokenization import TokenizerCache
from inference.triton_client import TritonReplicaClient
from llm_platform.redis_clients import async_redis
from inference.fallbacks import FallbackRecorder
from tenants.auth import KeyAuthenticator
from tenants.buckets import TokenBuckets
from tenants.selectors import LimitsCache


@dataclass
class Container:
    redis: aioredis.Redis
    key_prefix: str
    clock: Callable[[], float]
    tokenizers: TokenizerCache
    replica_client: ReplicaClient
    router: Router
    catalog: ServingCatalog
    idempotency: IdempotencyStore
    limits: LimitsCache
    buckets: TokenBuckets
    admission: AdmissionQueue
    signal_poller: SignalPoller
    rollouts: RolloutCatalog  # canary rollouts: which version serves a request
    fallbacks: FallbackRecorder  # canary requests that stable served instead
    process: ProcessLease  # this process is alive (pending Idempotency-Keys name it)
    auth: KeyAuthenticator  # API keys, cached in this process (revocations published)

    async def close(self) -> None:
        await self.auth.close()
        await self.process.stop()
        await self.signal_poller.stop()
        await self.admission.close()
        await self.replica_client.close()
        await self.redis.aclose()


def build_container(tokenizers: TokenizerCache) -> Container:
    redis = async_redis()
    clock = time.monotonic
    prefix = settings.REDIS_KEY_PREFIX
    signals = SignalStore(redis, prefix, settings.ROUTER_SIGNALS_TTL_SECONDS)
    poller = SignalPoller(signals, settings.ROUTER_SIGNALS_INTERVAL_SECONDS,
                          timeout_s=settings.ROUTER_SIGNALS_TIMEOUT_SECONDS)
    # Wall-clock time where Redis state is compared across processes.
    routing = RoutingState(
        redis=redis, key_prefix=prefix,
        prefix_index=PrefixIndex(redis, prefix, time.time, settings.ROUTER_PREFIX_TTL_SECONDS),
        signals=signals,
        circuit=CircuitBreaker(redis, prefix, time.time,
                               failure_threshold=settings.ROUTER_CIRCUIT_FAILURES,
                               cooldown_s=settings.ROUTER_CIRCUIT_COOLDOWN_SECONDS,
                               trial_timeout_s=settings.ROUTER_CIRCUIT_TRIAL_TIMEOUT_SECONDS),
        stats=RoutingStats(redis, prefix),
    )
    process = ProcessLease(redis, prefix, settings.API_PROCESS_LEASE_TTL_SECONDS,
                           settings.API_PROCESS_LEASE_TTL_SECONDS / 4)
    return Container(
        redis=redis,
        key_prefix=prefix,
        clock=clock,
        tokenizers=tokenizers,
        replica_client=TritonReplicaClient(
            first_token_timeout=settings.TRITON_FIRST_TOKEN_TIMEOUT_SECONDS,
            token_timeout=settings.TRITON_TOKEN_TIMEOUT_SECONDS,
            access_token=settings.REPLICA_ACCESS_TOKEN,
        ),
        router=Router(
            ReplicaDirectory(clock, settings.REGISTRY_CACHE_TTL_SECONDS),
            OutstandingTokens(redis, prefix, time.time, ttl_s=settings.ADMISSION_SLOT_TTL_SECONDS),
            random.Random(),
            routing,
            poller,
        ),
        catalog=ServingCatalog(clock, settings.REGISTRY_CACHE_TTL_SECONDS),
        idempotency=IdempotencyStore(
            redis, prefix, settings.IDEMPOTENCY_TTL_SECONDS,
            settings.IDEMPOTENCY_PENDING_TTL_SECONDS, process=process,
        ),
        limits=LimitsCache(redis, prefix, settings.QUOTA_LIMITS_CACHE_SECONDS),
        # Wall-clock time: bucket timestamps are compared across processes.
        buckets=TokenBuckets(redis, prefix, time.time),
        admission=AdmissionQueue(redis, prefix, time.time,
                                 ADMISSION_POLICIES[settings.ADMISSION_POLICY](),
                                 max_queue=settings.ADMISSION_MAX_QUEUE,
                                 slot_ttl_s=settings.ADMISSION_SLOT_TTL_SECONDS),
        signal_poller=poller,
        rollouts=RolloutCatalog(clock, settings.REGISTRY_CACHE_TTL_SECONDS, rollout_source),
        # Wall-clock minutes: the evaluator reads them in another process.
        fallbacks=FallbackRecorder(redis, prefix, time.time),
        process=process,
        auth=KeyAuthenticator(redis, prefix, settings.API_KEY_CACHE_SECONDS,
                              settings.API_KEY_NEGATIVE_CACHE_SECONDS),
    )


def current_container() -> Container:
    return apps.get_app_config("inference").containers.current()
