"""Engine faults through the API against fake Triton replicas (the real gRPC protocol): a request
that failed alone is a 500 and is not retried; a replica whose engine died is dropped from
routing at once and marked failed; the request it died serving is not retried elsewhere, one it
refused is; a tiny temperature reaches the replica as greedy."""
import json

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async

from inference.circuit import OPEN
from inference.container import current_container
from inference.router import OutstandingTokens
from fleet.lifecycle import history
from models_registry.models import Replica
from models_registry.services import register_replica
from tests.fakes.triton_server import start_fake

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def body(content: str, **extra) -> dict:
    return {"model": "chat-small", "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


async def post(client, payload, headers):
    return await client.post("/v1/chat/completions", data=json.dumps(payload),
                             content_type="application/json", headers=headers)


@pytest_asyncio.fixture
async def second_fake():
    fake = await start_fake()
    yield fake
    await fake.stop()


@pytest.fixture
def pair(model_version, fake_replica, second_fake):
    """(faulty, good): two ready replicas; the good one looks busy, so every policy picks the
    faulty one first."""
    faulty = register_replica(model_version, fake_replica.grpc_address,
                              metrics_address=fake_replica.metrics_address)
    good = register_replica(model_version, second_fake.grpc_address,
                            metrics_address=second_fake.metrics_address)
    return faulty, good


async def _look_busy(model_version, replica) -> None:
    container = current_container()
    await OutstandingTokens(container.redis, container.key_prefix).add(model_version.pk, replica.pk, 1_000_000)


async def _state(replica) -> str:
    return (await Replica.objects.aget(pk=replica.pk)).state


async def test_a_request_that_failed_alone_is_a_500_and_not_retried(client, auth, pair, model_version,
                                                                    second_fake):
    faulty, good = pair
    await _look_busy(model_version, good)
    response = await post(client, body("[request-failed]"), auth)
    assert response.status_code == 500, response.content
    error = response.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "model_error"
    assert "non-finite" in error["message"]
    assert second_fake.state.num_requests == 0  # not retried
    assert await _state(faulty) == Replica.State.READY  # not held against the replica
    states = await current_container().router.state.circuit.states([faulty.pk])
    assert states[faulty.pk] != OPEN


async def test_input_the_replica_refuses_is_a_400_and_not_retried(client, auth, pair, model_version,
                                                                  second_fake):
    faulty, good = pair
    await _look_busy(model_version, good)
    response = await post(client, body("[invalid]"), auth)
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
    assert second_fake.state.num_requests == 0


async def test_an_engine_dying_in_flight_drops_its_replica_at_once_without_retrying_the_request(
        client, auth, pair, model_version, fake_replica, second_fake):
    faulty, good = pair
    await _look_busy(model_version, good)
    response = await post(client, body("[kill-engine]"), auth)
    assert response.status_code == 503, response.content
    assert response.json()["error"]["code"] == "replica_error" and response["Retry-After"] == "1"
    assert second_fake.state.num_requests == 0  # it may be what killed the engine: not retried
    assert await _state(faulty) == Replica.State.FAILED
    transitions = await sync_to_async(history)(faulty.pk)
    assert transitions[-1][1] == Replica.State.FAILED and "engine died" in transitions[-1][2]
    states = await current_container().router.state.circuit.states([faulty.pk])
    assert states[faulty.pk] == OPEN
    # The next requests go to the good replica only, though it still looks busy.
    for _ in range(3):
        assert (await post(client, body("Hi"), auth)).status_code == 200
    assert fake_replica.state.num_requests == 1 and second_fake.state.num_requests == 3


async def test_a_request_refused_by_a_dead_engine_is_served_elsewhere_and_the_replica_marked_failed(
        client, auth, pair, model_version, fake_replica, second_fake):
    faulty, good = pair
    fake_replica.state.engine_dead = True
    await _look_busy(model_version, good)
    response = await post(client, body("Hi"), auth)
    assert response.status_code == 200, response.content
    assert fake_replica.state.num_requests == 1 and second_fake.state.num_requests == 1
    assert await _state(faulty) == Replica.State.FAILED


async def test_a_tiny_temperature_reaches_the_replica_as_greedy(client, auth, ready_replica, fake_replica):
    response = await post(client, body("Hi", temperature=1e-45), auth)
    assert response.status_code == 200, response.content
    assert fake_replica.state.requests[-1]["params"]["temperature"] == 0.0
    await post(client, body("Hi", temperature=0.5), auth)
    assert fake_replica.state.requests[-1]["params"]["temperature"] == 0.5
