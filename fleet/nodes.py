"""Nodes: registration and heartbeats from agents, and presuming silent nodes lost.

A node whose agent has not heartbeated for `lost_after_s` is presumed lost: it is marked
unschedulable, its live replicas are marked failed, and for each replica that was serving or
loading a replacement is placed on another node, preferring another zone (a silent node may be
the first of a zone going down). An agent that registers again gets its node back, but replicas
recorded on it are failed: a restarted agent has no children.
"""
from __future__ import annotations

from datetime import datetime, timedelta

import logging

from django.db import transaction

from billing.selectors import MissingPrice
from fleet.dispatch import Dispatcher
from fleet.lifecycle import LIVE_STATES, transition
from models_registry.models import Node, Replica, ScalingPolicy
from fleet.placement import place_replicas

logger = logging.getLogger(__name__)


def register_node(name: str, *, zone: str, address: str, cpu_slots: int, memory_mib: int,
                  accelerator: str, now: datetime, gpus: list[dict] | None = None) -> Node:
    """`gpus`: what the agent discovered (fleet/gpus.py: index, uuid, name, memory_mib)."""
    with transaction.atomic():
        node, _ = Node.objects.update_or_create(name=name, defaults={
            "zone": zone, "address": address, "cpu_slots": cpu_slots, "memory_mib": memory_mib,
            "accelerator": accelerator, "gpus": gpus or [], "is_schedulable": True, "lost_at": None,
            "last_heartbeat": now})
        for replica_id in Replica.objects.filter(node=node, state__in=LIVE_STATES).values_list("pk", flat=True):
            transition(replica_id, Replica.State.FAILED, f"agent of {name} restarted", now)
    return node


def heartbeat(name: str, now: datetime) -> bool:
    """False when the node is unknown or was presumed lost (the agent must register again)."""
    return bool(Node.objects.filter(name=name, lost_at__isnull=True).update(last_heartbeat=now))


def detect_lost_nodes(now: datetime, *, lost_after_s: float, dispatcher: Dispatcher) -> dict[str, list[int]]:
    """Returns node name -> ids of the replacement replicas placed for it."""
    cutoff = now - timedelta(seconds=lost_after_s)
    lost = list(Node.objects.filter(cpu_slots__gt=0, lost_at__isnull=True, last_heartbeat__lt=cutoff))
    replaced: dict[str, list[int]] = {}
    for node in lost:
        with transaction.atomic():
            if not Node.objects.filter(pk=node.pk, lost_at__isnull=True,
                                       last_heartbeat__lt=cutoff).update(lost_at=now, is_schedulable=False):
                continue  # heartbeated meanwhile, or another checker took it
            reason = f"node {node.name} lost: no heartbeat since {node.last_heartbeat:%H:%M:%S}"
            to_replace = []
            for replica in Replica.objects.filter(node=node, state__in=LIVE_STATES).select_related("model_version"):
                serving = replica.state in (Replica.State.LOADING, Replica.State.READY)
                if transition(replica.pk, Replica.State.FAILED, reason, now) and serving:
                    to_replace.append(replica.model_version)
            ids = []
            for version in to_replace:
                if not ScalingPolicy.objects.filter(model_version=version, enabled=True).exists():
                    continue  # hand-managed version: nobody asked the fleet to keep it up
                try:
                    ids += [r.pk for r in place_replicas(
                        version, 1, now=now, reason=f"replaces a replica of lost node {node.name}",
                        dispatcher=dispatcher, lost_after_s=lost_after_s,
                        avoid_zones=frozenset({node.zone}))]
                except MissingPrice as exc:
                    logger.error("not replacing a replica of %s: %s", version, exc)
            replaced[node.name] = ids
    return replaced
