"""`python -m benchmarks.floor_front_door`: the floor under the platform's front door, for
`benchmarks.gateway --floor`.

The least a Python front door does to relay a generation from a Triton replica, on the same
machine, the same replica and the same client as the platform in that benchmark: HTTP/1.1
parsed by httptools on uvloop (no Twisted, no ASGI, no Django), the API key compared with one
known key, the body read by orjson, the prompt encoded with the model's tokenizer (cached per
distinct messages, as the platform caches prompt pieces), one Redis round trip (an EVALSHA
adding the request's tokens to a counter: the shape of a quota check), the platform's own
Triton client (`inference.triton_client`: channels, submission batches), and each chunk
written as an SSE `token` event as it comes, then `done` with the usage. No quotas, admission,
routing, usage records, metrics, logs, request ids, deadlines or error replies: what the
platform adds over this is the cost of those features, not of Python or of the protocols.

Measurement only, never a server to run: it trusts its client and answers nothing but
`POST /v1/generate` with a benchmark's body.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools

import httptools
import orjson
import redis.asyncio as aioredis
import uvloop

from common.lean_redis import LeanRedis
from inference.replica_client import ReplicaRequest
from inference.tokenization import load_weights_tokenizer
from inference.triton_client import TritonReplicaClient
from llm_platform.lean_http.reply import chunk as chunked

_COUNT = "redis.call('INCRBY', KEYS[1], ARGV[1]) return 1"
_SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n")


class Floor:
    """What every connection shares: the key, Redis, the replica client, the prompts."""

    def __init__(self, grpc_address: str, redis_url: str, api_key: str, weights: str,
                 model: str):
        self.grpc_address = grpc_address
        self.authorization = f"Bearer {api_key}".encode()
        self.redis = LeanRedis.on_pool(aioredis.ConnectionPool.from_url(redis_url))
        self.count = self.redis.register_script(_COUNT)
        self.client = TritonReplicaClient(first_token_timeout=600, token_timeout=600,
                                          calls_per_replica=2, channels=True)
        self.tokenizer = load_weights_tokenizer(weights)
        self.model = model
        self.prompts: dict[bytes, tuple[str, tuple[int, ...]]] = {}
        self.ids = itertools.count()

    def prompt(self, messages: list[dict]) -> tuple[str, tuple[int, ...]]:
        key = orjson.dumps(messages)
        prompt = self.prompts.get(key)
        if prompt is None:
            prompt = self.prompts[key] = (self.tokenizer.apply_chat_template(messages),
                                          tuple(self.tokenizer.encode_chat(messages)))
        return prompt


class Connection(asyncio.Protocol):
    def __init__(self, floor: Floor):
        self.floor = floor
        self.parser = httptools.HttpRequestParser(self)
        self.transport = None
        self.authorization = b""
        self.body: list[bytes] = []

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"authorization":
            self.authorization = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body, self.body = b"".join(self.body), []
        asyncio.get_running_loop().create_task(self.serve(self.authorization, body))

    async def serve(self, authorization: bytes, raw: bytes) -> None:
        floor, write = self.floor, self.transport.write
        if authorization != floor.authorization:
            write(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
            return
        body = orjson.loads(raw)
        text, token_ids = floor.prompt(body["messages"])
        max_tokens = body["max_tokens"]
        await floor.count(keys=["floor-front-door:tokens"], args=[len(token_ids) + max_tokens])
        request = ReplicaRequest(request_id=f"floor-{next(floor.ids)}", model_name=floor.model,
                                 prompt_text=text, prompt_token_ids=token_ids,
                                 max_tokens=max_tokens, temperature=0.0, top_p=1.0, seed=None,
                                 stop=(), priority=0, tenant="floor")
        stream = body.get("stream", False)
        if stream:
            write(_SSE_HEAD)
        pieces, output_tokens = [], 0
        async for chunk in floor.client.stream(floor.grpc_address, request):
            if chunk.text:
                pieces.append(chunk.text)
                if stream:
                    event = b"event: token\ndata: " + orjson.dumps({"text": chunk.text}) + b"\n\n"
                    write(chunked(event))
            if chunk.final:
                output_tokens = chunk.num_output_tokens
        done = orjson.dumps({"text": "".join(pieces), "usage": {"output_tokens": output_tokens}})
        if stream:
            event = b"event: done\ndata: " + done + b"\n\n"
            write(chunked(event, last=True))
        else:
            write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(done), done))


async def serve(args) -> None:
    floor = Floor(args.grpc, args.redis, args.key, args.weights, args.model)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(floor), args.host, args.port,
                                      backlog=1024)
    print(f"floor front door on {args.host}:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--grpc", required=True, help="the replica's gRPC host:port")
    parser.add_argument("--redis", required=True, help="a Redis URL")
    parser.add_argument("--key", required=True, help="the one API key it accepts")
    parser.add_argument("--weights", required=True, help="the model's weights (its tokenizer)")
    parser.add_argument("--model", default="chat-small")
    args = parser.parse_args()
    uvloop.install()
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
