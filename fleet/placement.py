"""Placement: which node a new replica of a model version goes to, and which replicas go first.

A node is a candidate when its agent heartbeats, it is schedulable, not lost, and what is free
on it (announced capacity minus what its live replicas reserve) fits the replica:
- on a node with GPUs (unless the version's `hardware` says `"accelerator": "cpu"`): the
  version's `tensor_parallel_degree` GPUs that no live replica holds, each with at least the
  replica's share of device memory (weights + KV cache / degree), and host memory;
- on a CPU node (unless the version says `"accelerator": "gpu"`): CPU slots (the policy's per
  device, times the degree: a tensor-parallel replica on CPUs is one process per rank) and memory.
Among candidates: first avoid `avoid_zones` (a replacement for a lost node prefers another
zone), then the zone with the fewest replicas of this version (spread across zones), then the
node with the fewest replicas of this version, then the most free slots, then the name (stable).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction

from billing.selectors import require_price
from fleet.dispatch import Dispatcher
from fleet.lifecycle import LIVE_STATES, record_created, transition
from models_registry.models import ModelVersion, Node, Replica, ScalingPolicy


@dataclass(frozen=True)
class NodeRoom:
    node_id: int
    name: str
    zone: str
    free_cpu_slots: int
    free_memory_mib: int
    num_version_replicas: int  # live replicas of the version being placed
    free_gpus: tuple[tuple[int, int], ...] = ()  # (index, memory MiB) of GPUs no replica holds
    has_gpus: bool = False


@dataclass(frozen=True)
class ReplicaNeed:
    """What one replica of a version takes from its node."""

    cpu_slots: int = 1  # per device, on a CPU node
    memory_mib: int = 1024  # host memory
    devices: int = 1  # tensor-parallel degree
    device_memory_mib: int = 0  # on each GPU
    accelerator: str = ""  # "gpu" or "cpu" when the version requires one; "" either


@dataclass(frozen=True)
class Fit:
    room: NodeRoom
    cpu_slots: int  # reserved on the node
    gpu_indices: tuple[int, ...]  # the GPUs it holds (empty on a CPU node)


def fit(room: NodeRoom, need: ReplicaNeed) -> Fit | None:
    """How the replica fits on the node, or None."""
    if room.free_memory_mib < need.memory_mib:
        return None
    if room.has_gpus and need.accelerator != "cpu":
        gpus = sorted(i for i, memory in room.free_gpus if memory >= need.device_memory_mib)
        return Fit(room, 0, tuple(gpus[:need.devices])) if len(gpus) >= need.devices else None
    slots = need.cpu_slots * need.devices
    if need.accelerator == "gpu" or room.free_cpu_slots < slots:
        return None
    return Fit(room, slots, ())


def choose_node(rooms: list[NodeRoom], need: ReplicaNeed, zone_counts: dict[str, int],
                avoid_zones: frozenset[str] = frozenset()) -> Fit | None:
    fits = [f for f in (fit(r, need) for r in rooms) if f is not None]
    if not fits:
        return None
    return min(fits, key=lambda f: (f.room.zone in avoid_zones, zone_counts.get(f.room.zone, 0),
                                    f.room.num_version_replicas, -len(f.room.free_gpus),
                                    -f.room.free_cpu_slots, f.room.name))


def replica_need(model_version: ModelVersion, policy: ScalingPolicy | None) -> ReplicaNeed:
    accelerator = str((model_version.hardware or {}).get("accelerator", "")).lower()
    return ReplicaNeed(cpu_slots=policy.replica_cpu_slots if policy else 1,
                       memory_mib=policy.replica_memory_mib if policy else 1024,
                       devices=max(1, model_version.tensor_parallel_degree),
                       device_memory_mib=model_version.device_memory_mib,
                       accelerator=accelerator if accelerator in ("cpu", "gpu") else "")


def live_nodes(now: datetime, lost_after_s: float):
    return Node.objects.filter(cpu_slots__gt=0, is_schedulable=True, lost_at__isnull=True,
                               last_heartbeat__gte=now - timedelta(seconds=lost_after_s))


def _rooms(nodes: list[Node], model_version_id: int) -> tuple[list[NodeRoom], Counter]:
    live = list(Replica.objects.filter(node__in=nodes, state__in=LIVE_STATES)
                .values("node_id", "cpu_slots", "memory_mib", "model_version_id", "zone",
                        "gpu_indices"))
    rooms = []
    for node in nodes:
        mine = [r for r in live if r["node_id"] == node.pk]
        held = {i for r in mine for i in (r["gpu_indices"] or [])}
        gpus = node.gpus or []
        rooms.append(NodeRoom(
            node_id=node.pk, name=node.name, zone=node.zone,
            free_cpu_slots=node.cpu_slots - sum(r["cpu_slots"] for r in mine),
            free_memory_mib=node.memory_mib - sum(r["memory_mib"] for r in mine),
            num_version_replicas=sum(r["model_version_id"] == model_version_id for r in mine),
            free_gpus=tuple((g["index"], g["memory_mib"]) for g in gpus if g["index"] not in held),
            has_gpus=bool(gpus)))
    zones = Counter(r["zone"] for r in Replica.objects.filter(
        model_version_id=model_version_id, state__in=(Replica.State.LOADING, Replica.State.READY))
        .values("zone"))
    return rooms, zones


def place_replicas(model_version: ModelVersion, count: int, *, now: datetime, reason: str,
                   dispatcher: Dispatcher, lost_after_s: float,
                   avoid_zones: frozenset[str] = frozenset()) -> list[Replica]:
    """Create up to `count` loading replicas on chosen nodes and ask their agents to start
    them (after commit). Fewer when the fleet is full; the caller records that. Raises
    MissingPrice when the version has no price in effect (it may not serve)."""
    require_price(model_version, now)
    need = replica_need(model_version,
                        ScalingPolicy.objects.filter(model_version=model_version).first())
    placed: list[Replica] = []
    with transaction.atomic():
        # Lock the candidate nodes: two placements at once must not both take the last slot.
        nodes = list(live_nodes(now, lost_after_s).select_for_update().order_by("pk"))
        for _ in range(count):
            rooms, zones = _rooms(nodes, model_version.pk)
            chosen = choose_node(rooms, need, zones, avoid_zones)
            if chosen is None:
                break
            node = next(n for n in nodes if n.pk == chosen.room.node_id)
            replica = Replica.objects.create(
                model_version=model_version, node=node, zone=node.zone, grpc_address="",
                state=Replica.State.LOADING, managed=True, cpu_slots=chosen.cpu_slots,
                memory_mib=need.memory_mib, gpu_indices=list(chosen.gpu_indices),
                gpu_memory_mib=need.device_memory_mib if chosen.gpu_indices else 0)
            gpus = f", GPUs {','.join(map(str, chosen.gpu_indices))}" if chosen.gpu_indices else ""
            record_created(replica, f"placed on {node.name} (zone {node.zone or '-'}{gpus}): {reason}",
                           now)
            placed.append(replica)
            transaction.on_commit(lambda q=node.queue, rid=replica.pk: dispatcher.start(q, rid))
    return placed


def choose_victims(replicas: list[Replica], count: int, outstanding: dict[int, int]) -> list[Replica]:
    """Which replicas to remove: loading ones first (no traffic yet, newest first), then ready
    ones with the fewest outstanding tokens, each time from the zone holding the most."""
    victims: list[Replica] = []
    pool = list(replicas)
    for _ in range(min(count, len(pool))):
        zones = Counter(r.zone for r in pool)
        victim = min(pool, key=lambda r: (r.state != Replica.State.LOADING, -zones[r.zone],
                                          outstanding.get(r.pk, 0), -r.pk))
        victims.append(victim)
        pool.remove(victim)
    return victims


def drain_replicas(model_version: ModelVersion, count: int, *, now: datetime, reason: str,
                   dispatcher: Dispatcher, outstanding: dict[int, int]) -> list[Replica]:
    """Move `count` replicas to draining (the router stops sending them work at once) and ask
    their agents to stop them once in-flight streams finish."""
    candidates = list(Replica.objects.select_related("node").filter(
        model_version=model_version, managed=True,
        state__in=(Replica.State.LOADING, Replica.State.READY)))
    drained = []
    for victim in choose_victims(candidates, count, outstanding):
        if transition(victim.pk, Replica.State.DRAINING, reason, now,
                      only_from=(Replica.State.LOADING, Replica.State.READY)):
            drained.append(victim)
            if victim.node is not None:
                transaction.on_commit(lambda q=victim.node.queue, rid=victim.pk: dispatcher.stop(q, rid))
    return drained
