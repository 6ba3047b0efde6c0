"""The generation endpoints served straight from ASGI, past Django's handler.

`POST /v1/generate`, `/v1/chat/completions` and `/v1/completions` are most of the API's
traffic, and their views need nothing of Django's request machinery: they are key-authenticated
(no session, CSRF, user or messages), async, and build their own replies. Through Django's
handler a short request still paid for it: the body spooled into a temporary file, `META` built
from the headers, two tasks and a wait (the view and a disconnect listener), the URL resolver,
seven middleware layers, and the response's headers and chunks re-encoded on the way out, about
a fifth of the API process's CPU per short request (profile in benchmarks/README.md,
"gateway").

`DirectGeneration` wraps the Django ASGI application: those three paths, POSTed, are served
here; every other request (and any request this path is not sure it serves as Django would) goes
to Django unchanged. What Django's stack did for these requests, this path does the same way:

- the same view functions (`inference/views/generation.py`: `api_endpoint`'s method check,
  query bound and JSON errors), called with a `DirectRequest` (the headers, the body, method and
  path: all the views read);
- the request id, log context and HTTP metrics of `RequestContextMiddleware`, through the same
  functions (`begin_request`, `record_response`), and the handler's log line for a 4xx or 5xx
  reply (`django.request`);
- the headers of the stock middleware, computed from the same settings (`X-Content-Type-Options`,
  `Referrer-Policy`, `Cross-Origin-Opener-Policy`, `X-Frame-Options`, HSTS on a secure request,
  `Content-Length` on a whole reply);
- `ALLOWED_HOSTS`: a request whose host Django would refuse goes to Django, which refuses it;
  so do requests Django's settings would redirect (SECURE_SSL_REDIRECT, PREPEND_WWW), refuse by
  user agent (DISALLOWED_USER_AGENTS), or serve under a script prefix, and any request while a
  receiver other than Django's own listens to `request_started` / `request_finished`;
- a client that disconnects cancels its request (the replica's work is aborted, what it held is
  released), as Django's disconnect listener did; the request's database connection, if it
  opened one, goes back to the pool at its end (Django's `request_finished`).

A body larger than API_MAX_BODY_BYTES is not kept in memory past that size (Django spooled all
of it): its request is answered 413 as before. `API_DIRECT_PATH=0` sends everything through
Django (the A/B switch). tests/platform/test_direct_path.py holds both paths to the same replies.
"""
from __future__ import annotations

import asyncio
import time
from contextlib import aclosing

from asgiref.sync import ThreadSensitiveContext
from django.core import signals
from django.http.request import split_domain_port, validate_host
from django.utils.log import log_response

from inference.db_connection import release_db_connection
from inference.observability import request_ids
from inference.observability.middleware import begin_request, record_response
from inference.relay import LastChunk
from inference.views.generation import (
    chat_completions_view,
    completions_view,
    generate_view,
)
from llm_platform import idle_gc
from llm_platform.asgi_handler import only_djangos
from llm_platform.hot_settings import settings

_HOSTS_REMEMBERED = 256  # distinct Host headers whose check is kept (then forgotten at once)
ROUTES = {  # path -> (view, the route's label in the HTTP metrics, as Django's resolver names it)
    "/v1/generate": (generate_view, "/v1/generate"),
    "/v1/chat/completions": (chat_completions_view, "/v1/chat/completions"),
    "/v1/completions": (completions_view, "/v1/completions"),
}


class DirectRequest:
    """What the generation views read of a request (`lean_replies`: a successful reply comes
    as a `LeanReply`, not a Django response)."""

    __slots__ = ("method", "path", "headers", "body")
    lean_replies = True

    def __init__(self, method: str, path: str, headers: "Headers", body: bytes):
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body


class Headers(dict):
    """Request headers by lower-case name; `get` takes any case (as Django's `headers`)."""

    def get(self, name: str, default=None):
        return dict.get(self, name.lower(), default)


def _static_headers() -> list[tuple[bytes, bytes]]:
    """The headers Django's stock middleware adds to every API reply, from the same settings."""
    headers = []
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers.append((b"X-Content-Type-Options", b"nosniff"))
    if settings.SECURE_REFERRER_POLICY:
        policy = settings.SECURE_REFERRER_POLICY
        if not isinstance(policy, str):
            policy = ",".join(policy)
        headers.append((b"Referrer-Policy", policy.encode("latin1")))
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        headers.append((b"Cross-Origin-Opener-Policy",
                        settings.SECURE_CROSS_ORIGIN_OPENER_POLICY.encode("latin1")))
    return headers


def _hsts() -> bytes | None:
    if not settings.SECURE_HSTS_SECONDS:
        return None
    value = f"max-age={settings.SECURE_HSTS_SECONDS}"
    if settings.SECURE_HSTS_INCLUDE_SUBDOMAINS:
        value += "; includeSubDomains"
    if settings.SECURE_HSTS_PRELOAD:
        value += "; preload"
    return value.encode("latin1")


class DirectGeneration:
    """An ASGI application: the generation endpoints here, the rest to `django_app`."""

    def __init__(self, django_app):
        self._django = django_app
        self._static = _static_headers()
        self._frame_options = (b"X-Frame-Options", settings.X_FRAME_OPTIONS.upper().encode())
        self._hsts = _hsts()
        proxy = settings.SECURE_PROXY_SSL_HEADER
        # ("HTTP_X_FORWARDED_PROTO", "https") -> (b"x-forwarded-proto", "https")
        self._proxy_ssl = None if not proxy else (
            proxy[0].removeprefix("HTTP_").replace("_", "-").lower().encode("latin1"), proxy[1])
        self._allowed_hosts = list(settings.ALLOWED_HOSTS)
        self._hosts: dict[str, bool] = {}  # Host header -> allowed (ALLOWED_HOSTS is fixed)
        if settings.DEBUG and not self._allowed_hosts:  # as HttpRequest.get_host
            self._allowed_hosts = [".localhost", "127.0.0.1", "[::1]"]
        self._djangos_only = not (settings.SECURE_SSL_REDIRECT or settings.PREPEND_WWW
                                  or settings.DISALLOWED_USER_AGENTS
                                  or settings.USE_X_FORWARDED_HOST)

    async def __call__(self, scope, receive, send):
        route = ROUTES.get(scope["path"]) if scope["type"] == "http" else None
        if route is None or scope["method"] != "POST" or not self._djangos_only \
                or scope.get("root_path") or not only_djangos(signals.request_started) \
                or not only_djangos(signals.request_finished):
            return await self._django(scope, receive, send)
        headers = Headers()
        for name, value in scope["headers"]:
            name = name.decode("latin1").lower()
            value = value.decode("latin1")
            # Repeated headers are joined as Django's META joins them.
            headers[name] = f"{headers[name]},{value}" if name in headers else value
        if not self._host_allowed(headers, scope):
            return await self._django(scope, receive, send)  # Django's 400, as before
        async with ThreadSensitiveContext():  # a request's ORM calls get a thread of their own
            await self._serve(route, headers, scope, receive, send)

    def _host_allowed(self, headers: Headers, scope) -> bool:
        host = headers.get("host")
        if host is None:  # HTTP/1.0 without one: Django works out the server's name
            return False
        allowed = self._hosts.get(host)
        if allowed is None:  # a few distinct hosts in practice: each checked once
            domain, _port = split_domain_port(host)
            allowed = bool(domain) and validate_host(domain, self._allowed_hosts)
            if len(self._hosts) >= _HOSTS_REMEMBERED:
                self._hosts.clear()
            self._hosts[host] = allowed
        return allowed

    def _secure(self, headers: Headers, scope) -> bool:
        if self._proxy_ssl is not None:
            value = headers.get(self._proxy_ssl[0].decode("latin1"))
            if value is not None:
                return value.split(",", 1)[0].strip() == self._proxy_ssl[1]
        return scope.get("scheme") == "https"

    async def _serve(self, route, headers: Headers, scope, receive, send) -> None:
        view, label = route
        body = await _read_body(receive, settings.API_MAX_BODY_BYTES)
        if body is None:
            return  # the client left before its body arrived: nobody to answer
        started = time.perf_counter()
        secure = self._secure(headers, scope)
        request = DirectRequest("POST", scope["path"], headers, body)
        task = asyncio.current_task()
        gone = _Gone()
        # A client that disconnects cancels the request: told by lean_http's exchange itself
        # (`watch_gone`), else by a task waiting in `receive` for `http.disconnect`.
        watch_gone = getattr(getattr(receive, "__self__", None), "watch_gone", None)
        listener = None
        if watch_gone is not None:
            watch_gone(lambda: _cancel(task, gone))
        else:
            listener = asyncio.get_running_loop().create_task(_disconnect(receive, task, gone))
        collector = idle_gc.current()  # its collection waits for a moment with none in flight
        if collector is not None:
            collector.begin()
        response = None
        answered = 0.0  # when the view answered: the metric's time to the reply's headers
        try:
            request_id = await begin_request(headers.get(request_ids.HEADER))
            response = await view(request)
            answered = time.perf_counter()
            head = [(name.encode("latin1"), value.encode("latin1"))
                    for name, value in response.items()]
            head.append((request_ids.HEADER.encode("latin1"), request_id.encode("latin1")))
            head.extend(self._static)
            if self._hsts is not None and secure:
                head.append((b"Strict-Transport-Security", self._hsts))
            if not response.has_header("X-Frame-Options"):
                head.append(self._frame_options)
            # The reply's metric and log line are written once its first bytes are out, at
            # the end of the loop's turn: not on the way of this stream's first token, nor of
            # the others whose first tokens are ready in the same turn.
            if response.streaming:
                await send({"type": "http.response.start", "status": response.status_code,
                            "headers": head})
                content = getattr(response, "chunks", None)
                ended = False  # by a LastChunk: the body's end went out with it
                async with aclosing(content if content is not None
                                    else aiter(response)) as chunks:
                    async for chunk in chunks:
                        ended = type(chunk) is LastChunk
                        await send({"type": "http.response.body", "body": chunk,
                                    "more_body": not ended})
                        if answered:  # after the first tokens ready now are out, too
                            asyncio.get_running_loop().call_soon(
                                self._record, label, request, response, answered - started)
                            answered = 0.0
                if not ended:
                    await send({"type": "http.response.body"})
            else:
                content = response.content
                if not response.has_header("Content-Length"):
                    head.append((b"Content-Length", str(len(content)).encode("latin1")))
                await send({"type": "http.response.start", "status": response.status_code,
                            "headers": head})
                await send({"type": "http.response.body", "body": content})
        except asyncio.CancelledError:
            if not gone.is_set():
                raise  # the server's own cancellation (shutdown): not ours to swallow
            task.uncancel()  # the client left: the request ended with it
        finally:
            if answered:  # not recorded yet: a whole reply, or a stream that ended before
                self._record(label, request, response, answered - started)
            if listener is not None:
                listener.cancel()
            else:
                watch_gone(None)
            if collector is not None:
                collector.end()
            await release_db_connection()  # Django's request_finished: the connection, if any

    @staticmethod
    def _record(label: str, request: DirectRequest, response, elapsed_s: float) -> None:
        """The reply's HTTP metrics, and Django's handler's log line for a refusal."""
        record_response(label, "POST", response, elapsed_s)
        if response.status_code >= 400:
            log_response("%s: %s", response.reason_phrase, request.path,
                         response=response, request=request)


async def _read_body(receive, max_bytes: int) -> bytes | None:
    """The request's body (None if the client disconnected first). Past `max_bytes` the rest
    is read and dropped: the view refuses the body as too large (413) from its length."""
    chunks: list[bytes] = []
    kept = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        if chunk and kept <= max_bytes:  # past the limit, one chunk over it is enough
            chunks.append(chunk)
            kept += len(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class _Gone:
    """Whether the request's client disconnected (its task's cancellation is then ours)."""

    __slots__ = ("_set",)

    def __init__(self):
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


def _cancel(task: asyncio.Task, gone: _Gone) -> None:
    """The client disconnected: its request's task is cancelled (what it holds is released)."""
    gone.set()
    task.cancel()


async def _disconnect(receive, task: asyncio.Task, gone: _Gone) -> None:
    """Waits in `receive` for `http.disconnect` (an ASGI server other than lean_http)."""
    message = await receive()
    if message["type"] == "http.disconnect":
        _cancel(task, gone)
