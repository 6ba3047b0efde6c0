"""Conventions clients of the field rely on: GET /health, OpenAI finish_reason values only (an
aborted generation is an error), usage: null before the last chunk, OpenAI error types."""
import json

import pytest

from tests.support.platform import sse_events

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

CHAT = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


async def post(client, path, body, headers):
    return await client.post(path, data=json.dumps(body), content_type="application/json",
                             headers=headers)


async def streamed(response) -> bytes:
    return b"".join([chunk async for chunk in response.streaming_content])


async def test_health_is_liveness_without_dependencies(client):
    response = await client.get("/health")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
    assert response["X-Request-Id"]


async def test_usage_null_on_every_chunk_but_the_last(client, auth, ready_replica):
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    events = sse_events(await streamed(await post(client, "/v1/chat/completions", body, auth)))
    chunks = [data for _, data in events if data != "[DONE]"]
    assert events[-1][1] == "[DONE]"
    assert all("usage" in c and c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    plain = sse_events(await streamed(await post(client, "/v1/chat/completions",
                                                 {**CHAT, "stream": True}, auth)))
    assert all("usage" not in data for _, data in plain if data != "[DONE]")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_an_aborted_generation_is_an_error_on_openai_routes(client, auth, ready_replica,
                                                                  path):
    body = ({**CHAT, "messages": [{"role": "user", "content": "[abort]"}]}
            if path.endswith("chat/completions")
            else {"model": "chat-small", "prompt": "[abort]", "max_tokens": 4})
    events = sse_events(await streamed(await post(client, path, {**body, "stream": True}, auth)))
    reasons = [c["finish_reason"] for _, data in events if data != "[DONE]" and "choices" in data
               for c in data["choices"]]
    assert set(reasons) == {None}  # never "abort"
    errors = [data["error"] for _, data in events if isinstance(data, dict) and "error" in data]
    assert len(errors) == 1 and errors[0]["type"] == "server_error"
    assert errors[0]["code"] == "generation_aborted"
    whole = await post(client, path, body, auth)
    assert whole.status_code == 503 and whole.json()["error"]["code"] == "generation_aborted"
    assert whole["Retry-After"]


async def test_native_route_keeps_abort(client, auth, ready_replica):
    body = {**CHAT, "messages": [{"role": "user", "content": "[abort]"}]}
    response = await post(client, "/v1/generate", body, auth)
    assert response.status_code == 200 and response.json()["finish_reason"] == "abort"


async def test_error_types_are_openai_values(client, auth, ready_replica):
    bogus = {"Authorization": "Bearer llmp_00000000_bogus"}
    cases = [
        (await post(client, "/v1/chat/completions", CHAT, bogus), 401, "invalid_request_error"),
        (await post(client, "/v1/chat/completions", {**CHAT, "model": "nope"}, auth), 404,
         "invalid_request_error"),
        (await client.get("/v1/chat/completions", headers=auth), 405, "invalid_request_error"),
        (await client.get("/v1/models/nope", headers=auth), 404, "invalid_request_error"),
    ]
    for response, status, error_type in cases:
        assert response.status_code == status
        error = response.json()["error"]
        assert error["type"] == error_type and "param" in error


async def test_one_model_by_id(client, auth, ready_replica):
    listed = (await client.get("/v1/models", headers=auth)).json()["data"]
    one = await client.get("/v1/models/chat-small", headers=auth)
    assert one.status_code == 200 and one.json() == listed[0]
