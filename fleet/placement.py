"""Placement: which node a new replica of a model version goes to, and which replicas go first.

A node is a candidate when its agent heartbeats, it is schedulable, not lost, and its free CPU
slots and memory (announced capacity minus what its live replicas reserve) fit the replica.
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


def choose_node(rooms: list[NodeRoom], cpu_slots: int, memory_mib: int,
                zone_counts: dict[str, int], avoid_zones: frozenset[str] = frozenset()) -> NodeRoom | None:
    fits = [r for r in rooms if r.free_cpu_slots >= cpu_slots and r.free_memory_mib >= memory_mib]
    if not fits:
        return None
    return min(fits, key=lambda r: (r.zone in avoid_zones, zone_counts.get(r.zone, 0),
                                    r.num_version_replicas, -r.free_cpu_slots, r.name))


def live_nodes(now: datetime, lost_after_s: float):
    return Node.objects.filter(cpu_slots__gt=0, is_schedulable=True, lost_at__isnull=True,
                               last_heartbeat__gte=now - timedelta(seconds=lost_after_s))


def _rooms(nodes: list[Node], model_version_id: int) -> tuple[list[NodeRoom], Counter]:
    live = list(Replica.objects.filter(node__in=nodes, state__in=LIVE_STATES)
                .values("node_id", "cpu_slots", "memory_mib", "model_version_id", "zone"))
    rooms = []
    for node in nodes:
        mine = [r for r in live if r["node_id"] == node.pk]
        rooms.append(NodeRoom(
            node_id=node.pk, name=node.name, zone=node.zone,
            free_cpu_slots=node.cpu_slots - sum(r["cpu_slots"] for r in mine),
            free_memory_mib=node.memory_mib - sum(r["memory_mib"] for r in mine),
            num_version_replicas=sum(r["model_version_id"] == model_version_id for r in mine)))
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
    policy = ScalingPolicy.objects.filter(model_version=model_version).first()
    cpu_slots = policy.replica_cpu_slots if policy else 1
    memory_mib = policy.replica_memory_mib if policy else 1024
    placed: list[Replica] = []
    with transaction.atomic():
        # Lock the candidate nodes: two placements at once must not both take the last slot.
        nodes = list(live_nodes(now, lost_after_s).select_for_update().order_by("pk"))
        for _ in range(count):
            rooms, zones = _rooms(nodes, model_version.pk)
            room = choose_node(rooms, cpu_slots, memory_mib, zones, avoid_zones)
            if room is None:
                break
            node = next(n for n in nodes if n.pk == room.node_id)
            replica = Replica.objects.create(
                model_version=model_version, node=node, zone=node.zone, grpc_address="",
                state=Replica.State.LOADING, managed=True, cpu_slots=cpu_slots,
                memory_mib=memory_mib)
            record_created(replica, f"placed on {node.name} (zone {node.zone or '-'}): {reason}", now)
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
