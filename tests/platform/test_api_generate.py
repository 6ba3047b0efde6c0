"""The customer API in-process (Django's ASGI handler) against a fake Triton replica over
real gRPC, with the real PostgreSQL and Redis."""
import json

import pytest
from asgiref.sync import sync_to_async

from billing.models import UsageRecord
from tests.support.billing import drain
from tests.support.platform import joined_tokens, sse_events

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


async def post(client, path, body, headers):
    return await client.post(path, data=json.dumps(body), content_type="application/json",
                             headers=headers)


async def streamed(response) -> bytes:
    return b"".join([chunk async for chunk in response.streaming_content])


async def test_generate_non_streaming(client, auth, ready_replica, fake_replica):
    response = await post(client, "/v1/generate", BODY, auth)
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["text"] == " t0 t1 t2 t3"
    assert data["finish_reason"] == "length"
    # The byte tokenizer: the prompt is the ChatML rendering, one token per byte.
    sent = fake_replica.state.requests[0]
    assert data["usage"] == {"input_tokens": len(sent["input_ids"]), "output_tokens": 4}
    assert sent["text"].endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert sent["params"]["max_tokens"] == 4
    assert sent["priority"] == 0  # tier interactive


async def test_generate_streaming_events(client, auth, ready_replica):
    response = await post(client, "/v1/generate", {**BODY, "stream": True}, auth)
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    events = sse_events(await streamed(response))
    assert [name for name, _ in joined_tokens(events)] == ["token", "done"]
    assert "".join(data["text"] for name, data in events if name == "token") == " t0 t1 t2 t3"
    done = events[-1][1]
    assert done["finish_reason"] == "length"
    assert done["usage"]["output_tokens"] == 4
    assert done["usage"]["input_tokens"] > 0


async def test_usage_recorded_once_per_request(client, auth, ready_replica, tenant):
    await post(client, "/v1/generate", BODY, auth)
    response = await post(client, "/v1/generate", {**BODY, "stream": True}, auth)
    await streamed(response)
    await sync_to_async(drain)()  # the usage stream -> PostgreSQL
    rows = [r async for r in UsageRecord.objects.order_by("created_at")]
    assert len(rows) == 2
    assert {r.status for r in rows} == {"ok"}
    assert all(r.tenant_id == tenant.pk and r.replica_id == ready_replica.pk for r in rows)
    assert all(r.output_tokens == 4 and r.input_tokens > 0 and r.ttft_ms is not None for r in rows)
    assert [r.endpoint for r in rows] == ["generate", "generate"]


async def test_chat_completions_shapes(client, auth, ready_replica):
    response = await post(client, "/v1/chat/completions", BODY, auth)
    data = response.json()
    assert data["object"] == "chat.completion"
    assert data["id"].startswith("chatcmpl-")
    assert data["choices"][0]["message"] == {"role": "assistant", "content": " t0 t1 t2 t3"}
    assert data["usage"]["completion_tokens"] == 4
    assert data["usage"]["total_tokens"] == data["usage"]["prompt_tokens"] + 4

    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    events = sse_events(await streamed(await post(client, "/v1/chat/completions", body, auth)))
    assert events[-1] == (None, "[DONE]")
    chunks = [data for _, data in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) \
        == " t0 t1 t2 t3"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


async def test_completions_and_max_completion_tokens(client, auth, ready_replica, fake_replica):
    body = {"model": "chat-small", "prompt": "Once upon", "max_tokens": 2}
    data = (await post(client, "/v1/completions", body, auth)).json()
    assert data["object"] == "text_completion"
    assert data["choices"][0]["text"] == " t0 t1"
    assert fake_replica.state.requests[-1]["text"] == "Once upon"  # no chat template
    chat = {**BODY, "max_tokens": None, "max_completion_tokens": 3}
    data = (await post(client, "/v1/chat/completions", chat, auth)).json()
    assert data["usage"]["completion_tokens"] == 3


async def test_sampling_parameters_reach_the_replica(client, auth, ready_replica, fake_replica):
    body = {**BODY, "temperature": 0.0, "top_p": 0.5, "seed": 7, "stop": ["\n\n", "END"]}
    await post(client, "/v1/chat/completions", body, auth)
    params = fake_replica.state.requests[-1]["params"]
    assert params == {"max_tokens": 4, "temperature": 0.0, "top_p": 0.5, "seed": 7,
                      "stop": ["\n\n", "END"]}


async def test_models_lists_the_tenants_models(client, auth, model_version):
    data = (await client.get("/v1/models", headers=auth)).json()
    assert data["object"] == "list"
    assert [m["id"] for m in data["data"]] == ["chat-small"]


async def test_finish_reason_stop(client, auth, ready_replica):
    body = {**BODY, "messages": [{"role": "user", "content": "[stop]"}], "max_tokens": 10}
    data = (await post(client, "/v1/generate", body, auth)).json()
    assert data["finish_reason"] == "stop" and data["usage"]["output_tokens"] == 3
