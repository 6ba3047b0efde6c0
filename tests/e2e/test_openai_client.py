"""The official `openai` client, unchanged, against daphne + a Triton replica."""
import openai
import pytest

from tenants.models import Tenant
from tenants.services import create_api_key, create_tenant

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MESSAGES = [{"role": "user", "content": "Say hello in three words."}]


def client_for(fleet, key=None) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.base_url + "/v1", api_key=key or fleet.api_key,
                         max_retries=0, timeout=120)


def test_chat_completion_and_stream_agree(fleet):
    client = client_for(fleet)
    reply = client.chat.completions.create(model="chat-small", messages=MESSAGES, max_tokens=8,
                                           temperature=0.0, seed=1)
    text = reply.choices[0].message.content
    assert reply.object == "chat.completion" and reply.model == "chat-small"
    assert isinstance(text, str) and text
    assert reply.choices[0].finish_reason in {"stop", "length"}
    assert 0 < reply.usage.completion_tokens <= 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens

    chunks = list(client.chat.completions.create(
        model="chat-small", messages=MESSAGES, max_tokens=8, temperature=0.0, seed=1,
        stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text  # greedy: the same tokens either way
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == reply.usage.prompt_tokens
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [reply.choices[0].finish_reason]


def test_completions_stream_and_not(fleet):
    client = client_for(fleet)
    reply = client.completions.create(model="chat-small", prompt="The capital of France is",
                                      max_tokens=5, temperature=0.0)
    assert reply.object == "text_completion" and reply.choices[0].text
    assert reply.usage.completion_tokens <= 5
    chunks = list(client.completions.create(model="chat-small", prompt="The capital of France is",
                                            max_tokens=5, temperature=0.0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == reply.choices[0].text


def test_models_list(fleet):
    assert [m.id for m in client_for(fleet).models.list()] == ["chat-small"]


def test_errors_map_to_openai_exceptions(fleet):
    client = client_for(fleet)
    with pytest.raises(openai.AuthenticationError):
        client_for(fleet, key="llmp_00000000_bogus").chat.completions.create(
            model="chat-small", messages=MESSAGES, max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="chat-small", messages=[], max_tokens=2)
    with pytest.raises(openai.BadRequestError) as excinfo:
        client.chat.completions.create(model="chat-small", messages=MESSAGES, max_tokens=10**6)
    assert excinfo.value.code == "context_length_exceeded"
    headers = {"Idempotency-Key": "e2e-key"}
    client.chat.completions.create(model="chat-small", messages=MESSAGES, max_tokens=2,
                                   extra_headers=headers)
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model="chat-small", messages=MESSAGES, max_tokens=3,
                                       extra_headers=headers)


def test_idempotent_replay(fleet):
    client = client_for(fleet)
    headers = {"Idempotency-Key": "replay-1"}
    first = client.chat.completions.create(model="chat-small", messages=MESSAGES, max_tokens=6,
                                           temperature=1.0, extra_headers=headers)
    second = client.chat.completions.create(model="chat-small", messages=MESSAGES, max_tokens=6,
                                            temperature=1.0, extra_headers=headers)
    assert second.id == first.id
    assert second.choices[0].message.content == first.choices[0].message.content


def test_unimplemented_parameters_are_refused_by_name(fleet):
    client = client_for(fleet)
    refused = {
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "response_format": {"type": "json_object"},
        "logprobs": True,
        "presence_penalty": 0.5,
        "logit_bias": {"42": 5},
    }
    for param, value in refused.items():
        with pytest.raises(openai.BadRequestError) as excinfo:
            client.chat.completions.create(model="chat-small", messages=MESSAGES, max_tokens=2,
                                           **{param: value})
        assert (excinfo.value.code, excinfo.value.param) == ("unsupported_parameter", param)
    # The values that change nothing are served: a completion of its max_tokens, no error.
    # (Its text is not the point: two sampled tokens may decode to nothing, e.g. half of one
    # multi-byte character; greedy keeps the run repeatable.)
    reply = client.chat.completions.create(
        model="chat-small", messages=MESSAGES, max_tokens=2, n=1, user="u-1", logprobs=False,
        presence_penalty=0, frequency_penalty=0, response_format={"type": "text"},
        temperature=0.0)
    assert reply.object == "chat.completion" and reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 2


def test_suspended_tenant_is_permission_denied(fleet):
    tenant = create_tenant("suspended", "interactive")
    Tenant.objects.filter(pk=tenant.pk).update(requests_per_minute=0)
    client = client_for(fleet, key=create_api_key(tenant).raw_key)
    with pytest.raises(openai.PermissionDeniedError) as excinfo:
        client.chat.completions.create(model="chat-small", messages=MESSAGES, max_tokens=2)
    assert excinfo.value.code == "tenant_suspended"
