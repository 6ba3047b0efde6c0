"""llm_platform/middleware.py: an API request crosses Django's stock middleware without thread
hops; browser pages still get sessions, CSRF and the security headers."""
from __future__ import annotations

import asgiref.sync
import pytest

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def hops(monkeypatch) -> list[str]:
    """The name of every function sent through sync_to_async while the test runs."""
    seen: list[str] = []
    original = asgiref.sync.SyncToAsync.__init__

    def counting(self, func, *args, **kwargs):
        seen.append(getattr(func, "__qualname__", repr(func)))
        original(self, func, *args, **kwargs)

    monkeypatch.setattr(asgiref.sync.SyncToAsync, "__init__", counting)
    return seen


async def test_an_api_request_takes_no_middleware_hop(client, hops):
    response = await client.post("/v1/generate", data=b"{}",
                                        content_type="application/json")
    assert response.status_code == 401  # no key: refused by the view, after every middleware
    assert response["X-Content-Type-Options"] == "nosniff"  # SecurityMiddleware, inline
    assert response["X-Frame-Options"] == "DENY"  # XFrameOptionsMiddleware, inline
    middleware_hops = [name for name in hops if "Middleware" in name]
    assert middleware_hops == []
    # What is left is Django's ASGI handler's own: request_started, the response's close
    # (request_finished) and, for an error status, its log line.
    assert sorted(hops) == sorted(["Signal.asend.<locals>.sync_send", "HttpResponseBase.close",
                                   "log_response"]), hops


async def test_a_console_page_still_runs_the_browser_middleware(client, hops):
    response = await client.get("/admin/login/")
    assert response.status_code == 200
    assert "csrftoken" in response.cookies  # CsrfViewMiddleware ran
    assert response["X-Frame-Options"] == "DENY"
    assert any("Middleware" in name for name in hops)  # the browser ones, as Django runs them
