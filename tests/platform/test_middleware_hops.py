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


async def asgi_request(path: str, method: str, body: bytes = b"") -> int:
    """One HTTP request through the ASGI handler daphne runs (llm_platform/asgi_handler.py),
    which the Django test client bypasses; returns the status."""
    from asgiref.testing import ApplicationCommunicator

    from llm_platform.asgi_handler import InlineSignalsASGIHandler

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5000),
             "server": ("testserver", 80),
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}
    app = ApplicationCommunicator(InlineSignalsASGIHandler(), scope)
    await app.send_input({"type": "http.request", "body": body, "more_body": False})
    start = await app.receive_output(timeout=30)
    while (await app.receive_output(timeout=30)).get("more_body"):
        pass
    await app.wait(timeout=30)
    return start["status"]


async def test_the_asgi_handler_starts_no_thread_for_an_api_request(hops):
    assert await asgi_request("/v1/generate", "POST", b"{}") == 401
    # request_started and request_finished ran inline; only the error log line (Django's,
    # on the shared executor) is left.
    assert hops == ["log_response"], hops


async def test_the_asgi_handler_closes_a_page_on_its_own_thread(hops):
    assert await asgi_request("/admin/login/", "GET") == 200
    # The page's session and CSRF middleware ran on the request's thread: request_finished
    # (the response's close) runs there too, as Django's own handler does.
    assert "HttpResponseBase.close" in hops, hops
