"""Wires the billing reaper (billing/reaper.py) to the replicas: asks every serving replica of
a model (ready or draining) for its usage ledger entries over Triton's protocol, and to Redis
for the usage leases. A replica that does not answer is `unreachable` (the reaper waits)."""
from __future__ import annotations

import asyncio
from dataclasses import asdict
from datetime import datetime

import redis
from django.conf import settings

from billing.leases import held_leases
from billing.reaper import UNREACHABLE, ReapResult, ReplicaCount, reap_pending_usage
from inference.replica_client import ReplicaError
from inference.triton_client import TritonReplicaClient
from models_registry.models import Replica

SERVING_STATES = (Replica.State.READY, Replica.State.DRAINING)
QUERY_TIMEOUT_S = 10.0


def reap_usage(now: datetime) -> ReapResult:
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5.0,
                                  socket_connect_timeout=5.0)
    try:
        return reap_pending_usage(
            now, ask_replicas, lambda ids: held_leases(client, settings.REDIS_KEY_PREFIX, ids),
            min_age_s=settings.BILLING_REAPER_MIN_AGE_SECONDS,
            give_up_s=settings.BILLING_REAPER_GIVE_UP_SECONDS)
    finally:
        client.close()


def ask_replicas(model_name: str, request_ids: list[str]) -> dict[str, list[ReplicaCount]]:
    addresses = list(Replica.objects.filter(
        model_version__model__name=model_name, state__in=SERVING_STATES)
        .exclude(grpc_address="").values_list("grpc_address", flat=True))
    return asyncio.run(_ask_all(addresses, model_name, request_ids))


async def _ask_all(addresses: list[str], model_name: str,
                   request_ids: list[str]) -> dict[str, list[ReplicaCount]]:
    client = TritonReplicaClient(QUERY_TIMEOUT_S, QUERY_TIMEOUT_S,
                                 access_token=settings.REPLICA_ACCESS_TOKEN)
    try:
        answers = await asyncio.gather(*(_ask(client, address, model_name, request_ids)
                                         for address in addresses))
    finally:
        await client.close()
    return {rid: [answer[rid] for answer in answers] for rid in request_ids}


async def _ask(client: TritonReplicaClient, address: str, model_name: str,
               request_ids: list[str]) -> dict[str, ReplicaCount]:
    try:
        usage = await client.usage(address, model_name, request_ids)
    except (ReplicaError, OSError, asyncio.TimeoutError):
        return {rid: ReplicaCount(UNREACHABLE) for rid in request_ids}
    return {rid: ReplicaCount(**asdict(u)) for rid, u in usage.items()}
