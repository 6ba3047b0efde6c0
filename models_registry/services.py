"""Writes on the registry: models, versions, replicas."""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from models_registry.models import Model, ModelVersion, Node, Replica, StoredTokenizer
from replica.weights_cache import check_remote, fetch, is_remote


def ensure_model_version(
    model_name: str,
    version_number: int,
    weights_uri: str,
    *,
    tokenizer: str = ModelVersion.TokenizerKind.WEIGHTS,
    context_length: int = 2048,
    quantization: str = "",
    hardware: dict | None = None,
    is_public: bool = True,
    state: str = ModelVersion.State.ACTIVE,
    weights_sha256: str = "",
) -> ModelVersion:
    """Create the model and version, or update the version's fields if they exist. A version
    meant as a canary is registered `staging`, so it serves nothing before its rollout.
    https:// weights need their SHA-256 (WeightsError otherwise; see store_remote_tokenizer)."""
    if is_remote(weights_uri):
        check_remote(weights_uri, weights_sha256)
    with transaction.atomic():
        model, _ = Model.objects.get_or_create(name=model_name, defaults={"is_public": is_public})
        model_version, _ = ModelVersion.objects.update_or_create(
            model=model,
            version_number=version_number,
            defaults={
                "weights_uri": weights_uri,
                "weights_sha256": weights_sha256,
                "tokenizer": tokenizer,
                "context_length": context_length,
                "quantization": quantization,
                "hardware": hardware or {},
                "state": state,
            },
        )
    return model_version


def store_remote_tokenizer(model_version: ModelVersion, *, progress=None) -> StoredTokenizer:
    """Read the tokenizer of a version's https:// weights (fetched once into this host's cache
    and verified) and store it in the registry, so web hosts never need the weights: the
    version's tokenizer kind becomes `stored`."""
    from replica.engine.models.gguf_reader import GGUFReader  # noqa: PLC0415
    from replica.engine.tokenizer import Tokenizer  # noqa: PLC0415
    from replica.tokenizer_bundle import to_bundle  # noqa: PLC0415

    path = fetch(model_version.weights_uri, model_version.weights_sha256, progress=progress)
    bundle = to_bundle(Tokenizer.from_gguf_metadata(GGUFReader(str(path)).metadata))
    with transaction.atomic():
        stored, _ = StoredTokenizer.objects.update_or_create(model_version=model_version,
                                                             defaults={"bundle": bundle})
        ModelVersion.objects.filter(pk=model_version.pk).update(
            tokenizer=ModelVersion.TokenizerKind.STORED)
    model_version.tokenizer = ModelVersion.TokenizerKind.STORED
    return stored


def register_replica(
    model_version: ModelVersion,
    grpc_address: str,
    *,
    metrics_address: str = "",
    node_name: str = "",
    zone: str = "",
    state: str = Replica.State.READY,
) -> Replica:
    """Register (or re-register) the live replica at `grpc_address`."""
    with transaction.atomic():
        node = None
        if node_name:
            node, _ = Node.objects.get_or_create(name=node_name, defaults={"zone": zone})
        replica = (
            Replica.objects.select_for_update()
            .filter(grpc_address=grpc_address)
            .exclude(state=Replica.State.STOPPED)
            .first()
        )
        if replica is None:
            replica = Replica(grpc_address=grpc_address)
        replica.model_version = model_version
        replica.metrics_address = metrics_address
        replica.node = node
        replica.zone = zone
        replica.state = state
        replica.last_heartbeat = timezone.now()
        replica.save()
    return replica


def set_replica_state(replica: Replica, state: str) -> Replica:
    replica.state = state
    replica.save(update_fields=["state"])
    return replica
