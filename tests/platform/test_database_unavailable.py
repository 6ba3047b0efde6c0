"""A database that is down or whose pool is exhausted answers 503 JSON, never a 500 page."""
from __future__ import annotations

import json

import pytest
from django.db import OperationalError
from django.test import RequestFactory

from inference.views.errors import api_endpoint


@pytest.mark.asyncio
async def test_operational_error_becomes_503_with_retry_after():
    @api_endpoint("GET")
    async def view(request):
        raise OperationalError("couldn't get a connection after 10.00 sec")

    response = await view(RequestFactory().get("/v1/models"))
    assert response.status_code == 503
    assert response["Retry-After"] == "1"
    assert json.loads(response.content)["error"]["code"] == "database_unavailable"
