"""The live fleet feed: a replica's state change reaches an open socket (channels_redis on the
real Redis), whether it was saved by a service, the admin or a lifecycle transition."""
import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.utils import timezone

from llm_platform.asgi import application
from models_registry.models import Replica
from models_registry.services import register_replica, set_replica_state
from fleet.lifecycle import transition
from tests.platform.conftest import container_cleanup  # noqa: F401 (closes DB connections)

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def session_cookie(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def connect(user, origin=b"http://127.0.0.1"):
    headers = [(b"origin", origin)]
    if user is not None:
        headers.append((b"cookie", await sync_to_async(session_cookie)(user)))
    communicator = WebsocketCommunicator(application, "/ws/admin/fleet", headers=headers)
    connected, code = await communicator.connect(timeout=10)
    return communicator, connected, code


async def next_rows(communicator) -> list[dict]:
    while True:  # skip the periodic load messages
        message = await communicator.receive_json_from(timeout=10)
        if message["type"] == "replicas":
            return message["rows"]


async def test_state_changes_are_pushed(operator, model_version):
    replica = await sync_to_async(register_replica)(model_version, "127.0.0.1:9",
                                                    state="loading")
    communicator, connected, _ = await connect(operator)
    assert connected
    [row] = await next_rows(communicator)  # the snapshot
    assert (row["id"], row["state"]) == (replica.pk, "loading")

    await sync_to_async(set_replica_state)(replica, Replica.State.READY)  # a save
    [row] = await next_rows(communicator)
    assert (row["id"], row["state"]) == (replica.pk, "ready")

    # What the health check, node agents and autoscaler call.
    await sync_to_async(transition)(replica.pk, Replica.State.FAILED, "test", timezone.now())
    [row] = await next_rows(communicator)
    assert row["state"] == "failed"

    load = None
    while load is None:
        message = await communicator.receive_json_from(timeout=10)
        if message["type"] == "load":
            load = message["load"]
    assert load == {str(replica.pk): 0}
    await communicator.disconnect()


async def test_feed_is_closed_to_non_staff_and_other_origins(member_a, operator):
    _, connected, code = await connect(member_a)
    assert not connected and code == 4403
    _, connected, _ = await connect(None)
    assert not connected
    _, connected, _ = await connect(operator, origin=b"http://evil.example")
    assert not connected
