"""Replica changes pushed to the live fleet page through the channel layer.

Every save of a Replica publishes the replica's row after the transaction commits. State
changes of the health check, node agents and autoscaler go through
`fleet.lifecycle.transition`, which saves the row; admin edits save it too. A channel
layer that is down never fails the save: the page shows a stale row until the next change, and
says so when its socket drops.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Iterable

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from models_registry.models import Replica

logger = logging.getLogger(__name__)

FLEET_GROUP = "fleet"


def replica_rows(replica_ids: Iterable[int] | None = None) -> list[dict]:
    """The fleet page's rows (all replicas, or these), as plain JSON-able dicts."""
    query = Replica.objects.select_related("model_version__model", "node").order_by("pk")
    if replica_ids is not None:
        query = query.filter(pk__in=list(replica_ids))
    return [replica_row(r) for r in query]


def replica_row(replica: Replica) -> dict:
    return {
        "id": replica.pk,
        "model": replica.model_version.model.name,
        "version_number": replica.model_version.version_number,
        "model_version_id": replica.model_version_id,
        "grpc_address": replica.grpc_address,
        "node": replica.node.name if replica.node else "",
        "zone": replica.zone,
        "state": replica.state,
        "last_heartbeat": replica.last_heartbeat.isoformat() if replica.last_heartbeat else None,
    }


def _group_send(layer, rows: list[dict]) -> None:
    try:
        async_to_sync(layer.group_send)(FLEET_GROUP, {"type": "fleet.replicas", "rows": rows})
    except Exception:  # noqa: BLE001 - the page is a view; the registry write stands
        logger.exception("could not publish replica changes to the fleet page")


def _send(rows: list[dict]) -> None:
    layer = get_channel_layer()
    if layer is None or not rows:
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        _group_send(layer, rows)  # the usual case: a sync thread without an event loop
        return
    # A sync save on a thread that runs an event loop (which async_to_sync refuses): send
    # from a short-lived thread of its own.
    thread = threading.Thread(target=_group_send, args=(layer, rows), daemon=True)
    thread.start()
    thread.join(5)


def publish_replicas(replica_ids: Iterable[int]) -> None:
    """Publish these replicas' current rows once the surrounding transaction commits."""
    ids = list(replica_ids)
    transaction.on_commit(lambda: _send(replica_rows(ids)))


def on_replica_saved(sender, instance: Replica, **kwargs) -> None:
    publish_replicas([instance.pk])
