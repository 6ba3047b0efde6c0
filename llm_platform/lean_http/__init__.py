"""The API's HTTP/1.1 inside daphne: llhttp (httptools) in place of Twisted's `HTTPChannel`.

daphne reads HTTP through Twisted's `twisted.web.http` (a line receiver in Python, a `Request`
object with two header tables, a temporary content file and a `Deferred` per request) and writes
each reply through it again. Against a trivial ASGI app that was about 0.6 ms of CPU per request
on the 2-core machines here, when the whole API's budget is 1.5 ms (issue 17; numbers in
benchmarks/README.md, "frontdoor10"). This package keeps daphne (its CLI, endpoints, `--fd`
sockets, signal handling, the application and timeout checkers, WebSockets through Autobahn) and
replaces only the HTTP/1.1 protocol its factory builds per connection:

- `connection.LeanHTTPProtocol`, one per connection: llhttp (C, through `httptools`) parses the
  request line, headers, Content-Length and chunked bodies; requests are answered in order
  (pipelined ones wait their turn); a head the server refuses is answered here; a WebSocket
  upgrade hands the connection to daphne's own Twisted protocol, which speaks it as before;
- `exchange.Exchange`, one per request: the ASGI `receive` / `send` of its application instance
  (no queue, no Deferred), started when the head is complete; the body is handed over as it
  arrives; the reply's head goes out with its first body bytes (one write for a whole reply);
- `reply`: the bytes of a reply's head (status line, headers as the app gave them, sanitised,
  plus Content-Length or chunked framing, `server`, `date`, `connection: close`);
- `factory.LeanHTTPFactory`: what daphne's server builds connections with; it closes idle ones.

What daphne checked, this checks the same way: header names and values (llhttp rejects what
RFC 9110 does; `\\x85` is refused as daphne does), an ASCII path and query string, header names
with `_` dropped (CVE-2015-0219), `daphne-root-path`, `--proxy-headers`, `--http-timeout`, the
application close timeout, the access log (`server.log_action`). Twisted's limits on a request
head stay: a request line or one header line over 16 KiB is a 431, a head over 16 KiB in all or
with over 500 header lines a 400, both with an OpenAI-style JSON body
(llm_platform.request_heads); a connection idle for a minute between requests (or in a body
that stopped arriving) is closed (`API_HTTP_IDLE_SECONDS`). Writes have backpressure: when the
socket's buffer is full, `send` waits for it to drain.

`API_HTTP_PROTOCOL` chooses (llm_platform/server.py): `lean` (unset or empty: the default) or
`daphne` (Twisted's protocol, e.g. to compare with `benchmarks.gateway_ab`).
"""
from __future__ import annotations


def install() -> None:
    """Before daphne's Server runs: its HTTP connections get LeanHTTPProtocol."""
    import daphne.server

    from llm_platform.lean_http.factory import LeanHTTPFactory

    daphne.server.HTTPFactory = LeanHTTPFactory
