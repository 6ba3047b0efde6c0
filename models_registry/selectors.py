"""Reads on the registry, async for the request path. Returned objects are plain and frozen."""
from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q

from models_registry.models import Model, ModelVersion, Replica, ScalingPolicy


@dataclass(frozen=True)
class ServingVersion:
    model_name: str
    model_version_id: int
    version_number: int
    weights_uri: str
    tokenizer: str
    context_length: int
    routing_policy: str

    @classmethod
    def of(cls, model: Model, version: ModelVersion) -> ServingVersion:
        return cls(model_name=model.name, model_version_id=version.pk, version_number=version.version_number,
                   weights_uri=version.weights_uri, tokenizer=version.tokenizer,
                   context_length=version.context_length, routing_policy=model.routing_policy)


@dataclass(frozen=True)
class ReplicaInfo:
    replica_id: int
    grpc_address: str
    metrics_address: str
    zone: str


def _visible_to(tenant_id: int) -> Q:
    return Q(is_public=True) | Q(tenants__id=tenant_id)


async def serving_version(model_name: str, tenant_id: int) -> ServingVersion | None:
    """The version that serves `model_name` for this tenant: the newest active one.

    None when the model does not exist, the tenant may not use it, or it has no active
    version: all three are the same 404 to the customer.
    """
    model = await Model.objects.filter(_visible_to(tenant_id), name=model_name).distinct().afirst()
    if model is None:
        return None
    version = (
        await ModelVersion.objects.filter(model=model, state=ModelVersion.State.ACTIVE)
        .order_by("-version_number")
        .afirst()
    )
    if version is None:
        return None
    return ServingVersion.of(model, version)


async def models_for_tenant(tenant_id: int) -> list[dict]:
    """The models this tenant may use that have an active version, as OpenAI `model` objects."""
    rows = []
    query = (
        Model.objects.filter(_visible_to(tenant_id), versions__state=ModelVersion.State.ACTIVE)
        .distinct()
        .order_by("name")
    )
    async for model in query:
        rows.append(
            {
                "id": model.name,
                "object": "model",
                "created": int(model.created_at.timestamp()),
                "owned_by": "llm-platform",
            }
        )
    return rows


async def ready_replicas(model_version_id: int) -> list[ReplicaInfo]:
    query = Replica.objects.filter(
        model_version_id=model_version_id, state=Replica.State.READY
    ).order_by("pk")
    return [
        ReplicaInfo(
            replica_id=r.pk,
            grpc_address=r.grpc_address,
            metrics_address=r.metrics_address,
            zone=r.zone,
        )
        async for r in query
    ]


async def any_ready_replica() -> bool:
    return await Replica.objects.filter(state=Replica.State.READY).aexists()


async def can_cold_start(model_version_id: int) -> bool:
    """No replica is ready, but one is loading, or the version scales from zero: a request
    should wait for the first replica instead of being refused."""
    if await Replica.objects.filter(model_version_id=model_version_id,
                                    state=Replica.State.LOADING).aexists():
        return True
    return await ScalingPolicy.objects.filter(model_version_id=model_version_id, enabled=True,
                                              scale_to_zero=True).aexists()
