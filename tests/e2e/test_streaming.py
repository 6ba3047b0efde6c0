"""Raw SSE and WebSocket streaming of /v1/generate, and disconnects freeing the replica."""
import asyncio
import json

import httpx
import pytest
from websockets.asyncio.client import connect

from billing.models import UsageRecord
from tests.support.billing import drain
from tests.support.platform import joined_tokens, sse_events
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Count to five."}],
        "max_tokens": 6, "temperature": 0.0}
# Long enough to still be running when the client leaves ("[slow]" paces the fake replica).
LONG = {**BODY, "messages": [{"role": "user", "content": "Tell a very long story. [slow]"}],
        "max_tokens": 2000, "temperature": 1.0}


def wait_for(predicate, what: str):
    """Hang guard, not a performance threshold."""
    return wait_until(predicate, 60.0, what, period_s=0.1)


def test_sse_generate(fleet):
    response = httpx.post(fleet.base_url + "/v1/generate", json={**BODY, "stream": True},
                          headers=fleet.auth, timeout=120)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.content)
    names = [name for name, _ in events]
    assert names[-1] == "done" and set(names[:-1]) <= {"token"}
    done = events[-1][1]
    assert done["usage"]["output_tokens"] <= 6 and done["usage"]["input_tokens"] > 0
    assert done["finish_reason"] in {"stop", "length"}
    reply = httpx.post(fleet.base_url + "/v1/generate", json=BODY, headers=fleet.auth,
                       timeout=120).json()
    assert reply["text"] == "".join(data["text"] for name, data in events if name == "token")
    assert reply["usage"] == done["usage"]


def _cancelled_usage():
    drain()  # the usage stream -> PostgreSQL (what the billing consumer does)
    return UsageRecord.objects.filter(status="cancelled").first()


def test_sse_disconnect_cancels_on_the_replica(fleet):
    with httpx.Client(timeout=120) as client:
        with client.stream("POST", fleet.base_url + "/v1/generate", json={**LONG, "stream": True},
                           headers=fleet.auth) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("event: token"):
                    # The first token leaves alone, at once (later events carry whatever arrived
                    # together, so a sampled story may already have ended by a third event):
                    # still reading, the sequence runs. The replica publishes its gauges from a
                    # sender thread after each step, so the gauge may trail the token: wait for
                    # it. (Leaving the loop closes the stream.)
                    wait_for(lambda: fleet.replica.active_seqs() >= 1,
                             "the running sequence on the replica's gauge")
                    break
    wait_for(lambda: fleet.replica.active_seqs() == 0, "the replica's sequences to end")
    row = wait_for(_cancelled_usage, "the cancelled request's usage row")
    assert 1 <= row.output_tokens < 2000


def _ws_url(fleet) -> str:
    return fleet.base_url.replace("http://", "ws://") + "/v1/stream"


def test_websocket_stream_matches_sse(fleet):
    async def run():
        async with connect(_ws_url(fleet), additional_headers=fleet.auth) as ws:
            await ws.send(json.dumps(BODY))
            messages = []
            while not messages or messages[-1]["type"] not in {"done", "error"}:
                messages.append(json.loads(await ws.recv()))
            # The socket serves another request after the first.
            await ws.send(json.dumps({**BODY, "model": "nope"}))
            error = json.loads(await ws.recv())
            return messages, error

    messages, error = asyncio.run(run())
    sse = sse_events(httpx.post(fleet.base_url + "/v1/generate", json={**BODY, "stream": True},
                                headers=fleet.auth, timeout=120).content)
    for message in messages + [data for _, data in sse]:
        message.pop("id", None)  # each request has its own id
    # The same content and end (token boundaries are the relay's: tokens that arrive together
    # leave as one event).
    assert joined_tokens([(m.pop("type"), m) for m in messages]) == joined_tokens(sse)
    assert error["type"] == "error" and error["status"] == 404


def test_websocket_auth_and_disconnect(fleet):
    async def run():
        async with connect(_ws_url(fleet)) as ws:
            await ws.send(json.dumps(BODY))
            unauthenticated = json.loads(await ws.recv())
            await ws.send(json.dumps({**LONG, "api_key": fleet.api_key}))
            tokens = 0
            while tokens < 3:
                message = json.loads(await ws.recv())
                assert message["type"] == "token", message
                tokens += 1
        return unauthenticated

    unauthenticated = asyncio.run(run())
    assert unauthenticated["status"] == 401
    wait_for(lambda: fleet.replica.active_seqs() == 0, "the replica's sequences to end")
    wait_for(_cancelled_usage, "the cancelled request's usage row")


def test_healthz_and_readyz(fleet):
    assert httpx.get(fleet.base_url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(fleet.base_url + "/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": True, "redis": True, "replica": True}
