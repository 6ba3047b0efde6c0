"""GET /metrics answers loopback clients and holders of METRICS_TOKEN, nobody else (403)."""
import pytest
from django.test import AsyncClient, RequestFactory

from inference.views.metrics import metrics_view

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

TOKEN = "metrics-token-of-this-test"


class outside_client:  # noqa: N801 - stands in for a client at another address
    """The view itself, called with REMOTE_ADDR of a host elsewhere (the test client always
    connects from 127.0.0.1)."""

    async def get(self, path: str, headers: dict | None = None):
        request = RequestFactory().get(path, REMOTE_ADDR="203.0.113.5", headers=headers or {})
        return await metrics_view(request)


async def test_a_loopback_client_reads_the_metrics(settings):
    settings.METRICS_TOKEN = ""
    response = await AsyncClient().get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")


async def test_an_outside_client_without_the_token_is_refused(settings):
    settings.METRICS_TOKEN = TOKEN
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        response = await outside_client().get("/metrics", headers=headers)
        assert response.status_code == 403, headers
        assert b'"metrics_forbidden"' in response.content


async def test_an_outside_client_with_the_token_reads_them(settings):
    settings.METRICS_TOKEN = TOKEN
    response = await outside_client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")


async def test_no_token_configured_means_no_bearer_gets_in(settings):
    settings.METRICS_TOKEN = ""
    response = await outside_client().get("/metrics", headers={"Authorization": "Bearer "})
    assert response.status_code == 403


async def test_loopback_can_be_turned_off_for_a_local_proxy(settings):
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOW_LOOPBACK = False
    assert (await AsyncClient().get("/metrics")).status_code == 403
    response = await AsyncClient().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
