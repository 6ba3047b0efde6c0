"""The gateway benchmark's lean HTTP client (benchmarks/raw_http.py) against a small HTTP/1.1
server on a real socket: chunked SSE split anywhere, Content-Length bodies, errors, keep-alive."""
import asyncio
import json

import pytest

from benchmarks.raw_http import HttpError, RawClient

EVENTS = (b"event: start\ndata: {}\n\n" + b"".join(
    b"event: token\ndata: " + json.dumps({"text": f"t{i}"}).encode() + b"\n\n" for i in range(5))
    + b"event: done\ndata: {\"usage\": {\"output_tokens\": 5}}\n\n")


async def _serve(reader, writer, connections):
    connections.append(writer)
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        body = json.loads(await reader.readexactly(length))
        if body.get("stream"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            for start in range(0, len(EVENTS), 7):  # chunks cut through events and lines
                piece = EVENTS[start:start + 7]
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        else:
            status = b"429 Too Many Requests" if body.get("refuse") else b"200 OK"
            reply = json.dumps({"echo": body}).encode()
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(reply), reply))
        await writer.drain()


@pytest.fixture
def run_with_server():
    def run(check):
        async def go():
            connections = []
            server = await asyncio.start_server(lambda r, w: _serve(r, w, connections),
                                                "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            client = RawClient(f"http://127.0.0.1:{port}")
            try:
                return await check(client, connections)
            finally:
                await client.aclose()
                server.close()
        return asyncio.run(go())
    return run


def test_events_split_across_chunks_arrive_whole_and_in_order(run_with_server):
    async def check(client, _):
        seen = []
        assert await client.post("/v1/generate", {"stream": True}, {},
                                 lambda name, data: seen.append((name, data))) == b""
        return seen

    seen = run_with_server(check)
    assert [name for name, _ in seen] == [b"start"] + [b"token"] * 5 + [b"done"]
    assert [json.loads(data)["text"] for name, data in seen if name == b"token"] == [
        f"t{i}" for i in range(5)]
    assert json.loads(seen[-1][1])["usage"]["output_tokens"] == 5


def test_bodies_errors_and_one_kept_alive_connection(run_with_server):
    async def check(client, connections):
        whole = json.loads(await client.post("/x", {"a": 1}, {"Authorization": "Bearer k"}))
        with pytest.raises(HttpError) as refused:
            await client.post("/x", {"refuse": True}, {})
        await client.post("/v1/generate", {"stream": True}, {}, lambda name, data: None)
        again = json.loads(await client.post("/x", {"b": 2}, {}))
        return whole, refused.value, again, len(connections)

    whole, refused, again, opened = run_with_server(check)
    assert whole == {"echo": {"a": 1}} and again == {"echo": {"b": 2}}
    assert refused.status == 429 and b"refuse" in refused.body
    assert opened == 1  # every request, the refused one included, on the same connection
