"""Replica lifecycle: the allowed state changes, each recorded with its reason and time.

    (placed) -> loading -> ready -> draining -> stopped
                   \\         \\         \\
                    +---------+---------+--> failed -> stopped (its process is gone)

`ready` is set only by whoever proved the replica serves: the node agent after Triton answered
ready and one warm-up request completed (managed replicas), or the health check for replicas
registered by hand. `failed -> ready` exists for the latter only (a hand-registered server that
answers again). Every change goes through `transition`, which locks the row, checks the change
is allowed from the state the row is in now, and writes a ReplicaTransition.
"""
from __future__ import annotations

from datetime import datetime

from django.db import transaction

from fleet.models import ReplicaTransition
from models_registry.models import Replica

S = Replica.State
ALLOWED: dict[str, frozenset[str]] = {
    S.LOADING: frozenset({S.READY, S.DRAINING, S.FAILED, S.STOPPED}),
    S.READY: frozenset({S.DRAINING, S.FAILED, S.STOPPED}),
    S.DRAINING: frozenset({S.STOPPED, S.FAILED}),
    S.FAILED: frozenset({S.STOPPED, S.READY}),
    S.STOPPED: frozenset(),
}
LIVE_STATES = (S.LOADING, S.READY, S.DRAINING)


class IllegalTransition(Exception):
    pass


def record_created(replica: Replica, reason: str, now: datetime) -> ReplicaTransition:
    return ReplicaTransition.objects.create(replica=replica, from_state="", to_state=replica.state,
                                            reason=reason[:300], at=now)


def transition(replica_id: int, to_state: str, reason: str, now: datetime, *,
               only_from: tuple[str, ...] | None = None, **fields) -> bool:
    """Move the replica to `to_state` (and set `fields`); False when it is already there or
    not in `only_from` (someone else moved it first: not an error). Raises IllegalTransition
    for a change the lifecycle forbids."""
    with transaction.atomic():
        replica = Replica.objects.select_for_update().get(pk=replica_id)
        if replica.state == to_state or (only_from is not None and replica.state not in only_from):
            return False
        if to_state not in ALLOWED[replica.state]:
            raise IllegalTransition(f"replica {replica_id}: {replica.state} -> {to_state} is not allowed")
        if to_state == S.READY and replica.managed and replica.state == S.FAILED:
            raise IllegalTransition(f"replica {replica_id}: a failed managed replica is replaced, not revived")
        from_state = replica.state
        replica.state = to_state
        for name, value in fields.items():
            setattr(replica, name, value)
        replica.save(update_fields=["state", *fields])
        ReplicaTransition.objects.create(replica=replica, from_state=from_state, to_state=to_state,
                                         reason=reason[:300], at=now)
    return True


def history(replica_id: int) -> list[tuple[str, str, str]]:
    return [(t.from_state, t.to_state, t.reason)
            for t in ReplicaTransition.objects.filter(replica_id=replica_id)]
