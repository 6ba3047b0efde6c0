"""The replica health check (run by Celery beat) against a fake replica and a dead address."""
import pytest
from asgiref.sync import sync_to_async

from fleet.health_check import check_replicas
from models_registry.models import Replica
from models_registry.services import register_replica

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def test_states_follow_the_probe(model_version, fake_replica):
    register = sync_to_async(register_replica)
    loading = await register(model_version, fake_replica.grpc_address, state="loading")
    dead = await register(model_version, "127.0.0.1:1", state="ready")
    draining = await register(model_version, "127.0.0.1:2", state="draining")
    states = await check_replicas(timeout_s=5)
    assert states == {loading.pk: "ready", dead.pk: "failed"}
    assert (await Replica.objects.aget(pk=draining.pk)).state == "draining"
    refreshed = await Replica.objects.aget(pk=loading.pk)
    assert refreshed.state == "ready" and refreshed.last_heartbeat is not None
