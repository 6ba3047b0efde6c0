"""django-ratelimit: the per-key request rate on the API and login attempts on the console."""
import json

import pytest
from django.test import Client

BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_per_key_request_rate(client, auth, ready_replica, settings):
    settings.API_KEY_RATELIMIT = "2/m"
    statuses = []
    for _ in range(3):
        response = await client.post("/v1/generate", data=json.dumps(BODY),
                                     content_type="application/json", headers=auth)
        statuses.append(response.status_code)
    assert statuses == [200, 200, 429]
    assert response.json()["error"]["code"] == "api_key_rate_exceeded"
    assert int(response["Retry-After"]) >= 1


@pytest.mark.django_db
def test_console_login_attempts_are_limited(settings):
    console = Client(REMOTE_ADDR="10.9.8.7")
    statuses = [console.post("/admin/login/", {"username": "x", "password": "y"}).status_code
                for _ in range(11)]
    assert statuses[:10] == [200] * 10  # the form again, with an error
    assert statuses[10] == 403
