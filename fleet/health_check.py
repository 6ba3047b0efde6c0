"""Replica health: ask each live replica's Triton server whether its model is ready.

loading -> ready once the model answers ready (only replicas registered by hand: a node agent
promotes its own after a warm-up request); ready -> failed when the server does not answer.
`draining` and `stopped` are operator/launcher decisions and are left alone. Every change is a
recorded lifecycle transition.

A replica whose engine died answers every request "engine dead" and its launcher stops the
server (model readiness false), so the next check marks it failed; the request path that saw it
first does not wait for that check: it sends `inference.hooks.engine_died`, and
`on_engine_died` (connected in FleetConfig.ready()) marks it failed at once.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

import tritonclient.grpc.aio as triton_aio
from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from fleet.lifecycle import transition
from models_registry.models import Replica
from replica.access import grpc_headers


@dataclass(frozen=True)
class HealthCheckTarget:
    replica_id: int
    grpc_address: str
    model_name: str
    state: str
    managed: bool = False


async def _is_model_ready(target: HealthCheckTarget, timeout_s: float) -> bool:
    client = triton_aio.InferenceServerClient(target.grpc_address)
    try:
        # The health group is open, but a replica may restrict it too: the token goes along.
        ready = client.is_model_ready(target.model_name,
                                      headers=grpc_headers(settings.REPLICA_ACCESS_TOKEN))
        return bool(await asyncio.wait_for(ready, timeout_s))
    except Exception:  # noqa: BLE001 - unreachable, refused, timed out: all "not ready"
        return False
    finally:
        await client.close()


def _next_state(state: str, ready: bool, managed: bool = False) -> str:
    if state in {Replica.State.LOADING, Replica.State.FAILED} and ready and not managed:
        return Replica.State.READY
    if state == Replica.State.READY and not ready:
        return Replica.State.FAILED
    return state


async def check_replicas(timeout_s: float = 2.0) -> dict[int, str]:
    """HealthCheckTarget every replica in loading/ready/failed; returns replica id -> new state."""
    targets = [
        HealthCheckTarget(r.pk, r.grpc_address, r.model_version.model.name, r.state, r.managed)
        async for r in Replica.objects.select_related("model_version__model").filter(
            state__in=[Replica.State.LOADING, Replica.State.READY, Replica.State.FAILED])
        .exclude(grpc_address="")
    ]
    results = await asyncio.gather(*(_is_model_ready(p, timeout_s) for p in targets))
    states = {}
    now = timezone.now()
    for target, ready in zip(targets, results):
        new_state = _next_state(target.state, ready, target.managed)
        if ready:
            await Replica.objects.filter(pk=target.replica_id).aupdate(last_heartbeat=now)
        if new_state != target.state:
            reason = "health check: model ready" if ready else "health check: no answer"
            # Only if nobody changed the state meanwhile (an operator draining it, say).
            await sync_to_async(transition)(target.replica_id, new_state, reason, now,
                                            only_from=(target.state,))
        states[target.replica_id] = new_state
    return states


async def on_engine_died(sender, *, replica_id: int, reason: str, **kwargs) -> bool:
    """The request path saw this replica's engine die: loading/ready -> failed now (the node
    agent then stops its process and the autoscaler places a replacement). False when it was
    not loading or ready any more (someone else moved it first)."""
    return await sync_to_async(transition)(
        replica_id, Replica.State.FAILED, f"engine died: {reason}"[:300], timezone.now(),
        only_from=(Replica.State.LOADING, Replica.State.READY))


def connect_engine_death() -> None:
    from inference.hooks import engine_died  # noqa: PLC0415 - apps are loaded by now

    engine_died.connect(on_engine_died, dispatch_uid="fleet.health_check.on_engine_died")
