"""Replica health: ask each live replica's Triton server whether its model is ready.

loading -> ready once the model answers ready; ready -> failed when the server does not
answer. `draining` and `stopped` are operator/launcher decisions and are left alone.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

import tritonclient.grpc.aio as triton_aio
from asgiref.sync import sync_to_async
from django.utils import timezone

from models_registry.models import Replica
from models_registry.signals import replica_states_changed


@dataclass(frozen=True)
class Probe:
    replica_id: int
    grpc_address: str
    model_name: str
    state: str


async def _is_model_ready(probe: Probe, timeout_s: float) -> bool:
    client = triton_aio.InferenceServerClient(probe.grpc_address)
    try:
        return bool(await asyncio.wait_for(client.is_model_ready(probe.model_name), timeout_s))
    except Exception:  # noqa: BLE001 - unreachable, refused, timed out: all "not ready"
        return False
    finally:
        await client.close()


def _next_state(state: str, ready: bool) -> str:
    if state in {Replica.State.LOADING, Replica.State.FAILED} and ready:
        return Replica.State.READY
    if state == Replica.State.READY and not ready:
        return Replica.State.FAILED
    return state


async def check_replicas(timeout_s: float = 2.0) -> dict[int, str]:
    """Probe every replica in loading/ready/failed; returns replica id -> new state."""
    probes = [
        Probe(r.pk, r.grpc_address, r.model_version.model.name, r.state)
        async for r in Replica.objects.select_related("model_version__model").filter(
            state__in=[Replica.State.LOADING, Replica.State.READY, Replica.State.FAILED])
    ]
    results = await asyncio.gather(*(_is_model_ready(p, timeout_s) for p in probes))
    states = {}
    changed: list[int] = []
    now = timezone.now()
    for probe, ready in zip(probes, results):
        new_state = _next_state(probe.state, ready)
        fields = {"state": new_state}
        if ready:
            fields["last_heartbeat"] = now
        # Only if nobody changed the state meanwhile (an operator draining it, say).
        num_updated = await sync_to_async(
            Replica.objects.filter(pk=probe.replica_id, state=probe.state).update
        )(**fields)
        states[probe.replica_id] = new_state
        if num_updated and new_state != probe.state:
            changed.append(probe.replica_id)
    if changed:
        # `.update()` sends no post_save: tell listeners (the live fleet page) ourselves.
        await replica_states_changed.asend(sender=Replica, replica_ids=changed)
    return states
