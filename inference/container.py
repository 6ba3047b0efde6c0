"""Where the request path is wired: its steps and what each one uses, built once per event loop.

`build_container` makes the shared resources (one Redis client, the replica client, the
router, the caches) and hands each step exactly the collaborators it uses, as constructor
arguments: `Preparation` (inference/pipeline.py: authenticate, parse, version, quota,
idempotency) and `Generation` (inference/generation.py: admit, route and stream, finish).
Views and the WebSocket consumer take the steps from here; nothing below asks the container
for anything. The container also owns the resources' lifetime (`close`) and lends a few of
them to the /metrics view and to tests.

Redis asyncio clients and gRPC channels belong to the loop that created them, so the
container is per loop; the tokenizer cache is per process. Both hang off the inference
AppConfig rather than module globals (`common.per_loop.PerLoop`); tests may replace
`InferenceConfig.containers.factory`.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

import redis.asyncio as aioredis
from django.apps import apps
from django.conf import settings

from inference.admission import ADMISSION_POLICIES, AdmissionQueue
from inference.canary import RolloutCatalog, VersionChooser
from inference.generation import Generation
from inference.hooks import rollout_source
from inference.idempotency import IdempotencyStore
from inference.pipeline import Preparation
from inference.first_token_priority import FirstTokenPriority
from inference.prompts import PromptEncoder
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
    preparation: Preparation  # everything before admission
    generation: Generation  # admit, route and stream, finish
    first_tokens: FirstTokenPriority  # requests before their first token go first
    # Shared resources: closed with the container; lent to /metrics and tests.
    redis: aioredis.Redis
    key_prefix: str
    router: Router
    admission: AdmissionQueue
    buckets: TokenBuckets
    replica_client: ReplicaClient
    signal_poller: SignalPoller
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
    replica_client = TritonReplicaClient(
        first_token_timeout=settings.TRITON_FIRST_TOKEN_TIMEOUT_SECONDS,
        token_timeout=settings.TRITON_TOKEN_TIMEOUT_SECONDS,
        access_token=settings.REPLICA_ACCESS_TOKEN,
        calls_per_replica=settings.TRITON_CALLS_PER_REPLICA,
        call_idle_s=settings.TRITON_CALL_IDLE_SECONDS,
        channels=settings.TRITON_CHANNELS,
    )
    router = Router(
        ReplicaDirectory(clock, settings.REGISTRY_CACHE_TTL_SECONDS),
        OutstandingTokens(redis, prefix, time.time, ttl_s=settings.ADMISSION_SLOT_TTL_SECONDS),
        random.Random(),
        routing,
        poller,
    )
    idempotency = IdempotencyStore(redis, prefix, settings.IDEMPOTENCY_TTL_SECONDS,
                                   settings.IDEMPOTENCY_PENDING_TTL_SECONDS, process=process)
    # Wall-clock time: bucket timestamps are compared across processes.
    buckets = TokenBuckets(redis, prefix, time.time)
    admission = AdmissionQueue(redis, prefix, time.time,
                               ADMISSION_POLICIES[settings.ADMISSION_POLICY](),
                               max_queue=settings.ADMISSION_MAX_QUEUE,
                               slot_ttl_s=settings.ADMISSION_SLOT_TTL_SECONDS)
    versions = VersionChooser(
        RolloutCatalog(clock, settings.REGISTRY_CACHE_TTL_SECONDS, rollout_source),
        # Wall-clock minutes: the evaluator reads them in another process.
        FallbackRecorder(redis, prefix, time.time),
        router.num_ready,
        PromptEncoder(tokenizers, settings.PROMPT_SEGMENT_CACHE_CHARS),
    )
    auth = KeyAuthenticator(redis, prefix, settings.API_KEY_CACHE_SECONDS,
                            settings.API_KEY_NEGATIVE_CACHE_SECONDS)
    preparation = Preparation(
        auth=auth, redis=redis, key_prefix=prefix,
        catalog=ServingCatalog(clock, settings.REGISTRY_CACHE_TTL_SECONDS),
        versions=versions, idempotency=idempotency,
        limits=LimitsCache(redis, prefix, settings.QUOTA_LIMITS_CACHE_SECONDS),
        buckets=buckets,
    )
    generation = Generation(
        admission=admission, router=router, replica_client=replica_client, versions=versions,
        idempotency=idempotency, buckets=buckets, redis=redis, key_prefix=prefix, clock=clock,
    )
    return Container(
        preparation=preparation, generation=generation, redis=redis, key_prefix=prefix,
        router=router, admission=admission, buckets=buckets, replica_client=replica_client,
        signal_poller=poller, process=process, auth=auth,
        first_tokens=FirstTokenPriority(settings.API_RELAY_DEFER_MS / 1000.0),
    )


def current_container() -> Container:
    return apps.get_app_config("inference").containers.current()
