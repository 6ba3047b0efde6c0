"""Pipelines sent over a lean connection: redis-py's commands and reply callbacks, without
redis-py's per-call machinery.

redis-py 8 spends about 60 us of CPU on every pipeline it sends, besides the commands: the pool
checkout (an asyncio.Condition, a timeout, a connection check), observability hooks, HIMPORT
bookkeeping, the retry wrapper and the release; the same round trip written and read directly
(hiredis packing and parsing, uvloop) costs about 15 us here. The API sends three or four per
request. `LeanRedis` is a redis-py asyncio client whose plain pipelines
(`pipeline(transaction=False)`, without redis-py `Script` objects: common/pipelines.py queues
EVALSHA itself) are queued by redis-py's own methods, so the commands, their arguments (encoded by
the pool's encoder) and the reply callbacks are redis-py's, and sent by `execute` over a
connection of its own small pool (`LeanPool`). What holds as with redis-py's pool
(llm_platform/redis_clients.py):

- an error reply of one command is that command's result (a `ResponseError`, `NoScriptError`
  for NOSCRIPT, parsed as redis-py parses it), raised first with `raise_on_error`;
- a connection that fails raises `redis.ConnectionError`, a reply later than `socket_timeout`
  raises `redis.TimeoutError`; the whole pipeline is sent once more on a fresh connection after
  a connection error (a connection that died while idle), never after a timeout;
- at most `max_connections` connections; a caller waits up to `wait_timeout` for one, then gets
  `ConnectionError("No connection available.")`;
- a connection whose round trip did not complete (an error, a timeout, a cancellation) is
  closed, never reused.

A single EVALSHA (what a redis-py `Script` call sends) takes the same path, its error reply
raised as redis-py raises it (NOSCRIPT as `NoScriptError`: the `Script` loads itself and runs
again). Everything else (other single commands, transactions, pub/sub, blocking reads) goes
through redis-py unchanged, and so does everything of a client whose pool is not a plain TCP
one (TLS, a Unix socket) or that decodes replies.
"""
from __future__ import annotations

import asyncio
import inspect
import socket
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis._parsers.base import BaseParser
from redis.asyncio.client import EMPTY_RESPONSE, NEVER_DECODE, Pipeline
from redis.asyncio.connection import DEFAULT_RESP_VERSION, Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

_NOT_ENOUGH = object()
_READ_SIZE = 65536


class LeanConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader = reader
        self._writer = writer
        self._parser = hiredis.Reader(protocolError=InvalidResponse,
                                      replyError=BaseParser.parse_error,
                                      notEnoughData=_NOT_ENOUGH)

    def send(self, packed: bytes) -> None:
        self._writer.write(packed)

    async def replies(self, count: int) -> list:
        parser, reader, out = self._parser, self._reader, []
        while len(out) < count:
            reply = parser.gets()
            if reply is _NOT_ENOUGH:
                data = await reader.read(_READ_SIZE)
                if not data:
                    raise RedisConnectionError("Connection closed by server.")
                parser.feed(data)
                continue
            out.append(reply)
        return out

    @property
    def reusable(self) -> bool:
        """Nothing left unread and not closed by the server (as redis-py checks at checkout)."""
        return not self._reader.at_eof() and not self._parser.has_data()

    def close(self) -> None:
        self._writer.close()


class LeanPool:
    def __init__(self, *, host: str, port: int, db: int, username: str | None,
                 password: str | None, protocol: int, client_name: str | None,
                 connect_timeout: float | None,
                 socket_timeout: float | None, max_connections: int, wait_timeout: float | None,
                 encoder):
        self._host, self._port, self._db = host, port, db
        self._username, self._password = username, password
        self._protocol, self._client_name = protocol, client_name
        self._connect_timeout, self._socket_timeout = connect_timeout, socket_timeout
        self._wait_timeout = wait_timeout
        self._encode = encoder.encode
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[LeanConnection] = []

    def pack(self, commands: list[tuple]) -> bytes:
        """The commands as redis-py writes them (a first argument with spaces is split, every
        argument encoded by the pool's encoder)."""
        encode, parts = self._encode, []
        for args in commands:
            name = args[0]
            if isinstance(name, str) and " " in name:
                args = (*name.split(), *args[1:])
            parts.append(hiredis.pack_command(tuple(map(encode, args))))
        return b"".join(parts)

    async def execute(self, commands: list[tuple]) -> list:
        """Send the commands in one write and read their replies (error replies as exception
        instances among them)."""
        packed = self.pack(commands)
        for attempt in (1, 2):
            try:
                return await self._round_trip(packed, len(commands))
            except RedisConnectionError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _round_trip(self, packed: bytes, count: int) -> list:
        try:
            async with asyncio.timeout(self._wait_timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise RedisConnectionError("No connection available.") from None
        connection = None
        try:
            connection = await self._checkout()
            try:
                connection.send(packed)
                async with asyncio.timeout(self._socket_timeout):
                    replies = await connection.replies(count)
            except TimeoutError:
                raise RedisTimeoutError("Timeout reading from socket") from None
            except OSError as exc:
                raise RedisConnectionError(f"Error while reading from {self._host}:"
                                           f"{self._port}: {exc!r}") from exc
        except BaseException:
            if connection is not None:
                connection.close()
            self._slots.release()
            raise
        self._idle.append(connection)
        self._slots.release()
        return replies

    async def _checkout(self) -> LeanConnection:
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable:
                return connection
            connection.close()
        return await self._connect()

    async def _connect(self) -> LeanConnection:
        try:
            async with asyncio.timeout(self._connect_timeout):
                reader, writer = await asyncio.open_connection(self._host, self._port)
        except TimeoutError:
            raise RedisTimeoutError("Timeout connecting to server") from None
        except OSError as exc:
            raise RedisConnectionError(f"Error connecting to {self._host}:{self._port}. "
                                       f"{exc}") from exc
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = LeanConnection(reader, writer)
        # What redis-py's connection sends first (its on_connect): the protocol (RESP3 replies
        # are what the client's reply callbacks expect then), the credentials, the name, the db.
        handshake: list[tuple] = []
        credentials = ((self._username or "default", self._password)
                       if self._password is not None else ())
        if self._protocol == 3:
            handshake.append(("HELLO", 3, "AUTH", *credentials) if credentials
                             else ("HELLO", 3))
        elif credentials:
            handshake.append(("AUTH", *credentials) if self._username else
                             ("AUTH", self._password))
        if self._client_name:
            handshake.append(("CLIENT SETNAME", self._client_name))
        if self._db:
            handshake.append(("SELECT", self._db))
        if handshake:
            try:
                connection.send(self.pack(handshake))
                async with asyncio.timeout(self._socket_timeout):
                    replies = await connection.replies(len(handshake))
            except BaseException as exc:
                connection.close()
                if isinstance(exc, TimeoutError):
                    raise RedisTimeoutError("Timeout reading from socket") from None
                if isinstance(exc, OSError):
                    raise RedisConnectionError(f"Error while reading from {self._host}:"
                                               f"{self._port}: {exc!r}") from exc
                raise
            for reply in replies:
                if isinstance(reply, ResponseError):
                    connection.close()
                    raise RedisConnectionError(f"Redis refused the connection's setup: {reply}")
        return connection

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()


def _parsed(callbacks, args: tuple, options: dict, reply):
    """A reply through the client's callback for its command, as redis-py's parse_response."""
    name = args[0]
    if name in callbacks:
        options = {k: v for k, v in options.items()
                   if k not in (EMPTY_RESPONSE, NEVER_DECODE, "keys")}
        return callbacks[name](reply, **options)
    return reply


class LeanPipeline(Pipeline):
    """A redis-py pipeline whose plain form is sent by a `LeanPool` (see the module)."""

    lean: LeanPool

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        if self.is_transaction or self.explicit_transaction or self.watching or self.scripts:
            return await super().execute(raise_on_error)
        stack = self.command_stack
        if not stack:
            return []
        try:
            replies = await self.lean.execute([args for args, _ in stack])
            callbacks = self.response_callbacks
            response = []
            for (args, options), reply in zip(stack, replies):
                if isinstance(reply, ResponseError):
                    response.append(options[EMPTY_RESPONSE] if EMPTY_RESPONSE in options
                                    else reply)
                    continue
                reply = _parsed(callbacks, args, options, reply)
                if inspect.isawaitable(reply):
                    reply = await reply
                response.append(reply)
            if raise_on_error:
                self.raise_first_error(stack, response)
            return response
        finally:
            await self.reset()


class LeanRedis(aioredis.Redis):
    """A redis-py asyncio client whose plain pipelines go through a `LeanPool` (see the
    module); `lean` is None where that does not apply."""

    lean: LeanPool | None = None

    @classmethod
    def on_pool(cls, pool: aioredis.ConnectionPool, max_connections: int,
                wait_timeout: float | None) -> "LeanRedis":
        client = cls.from_pool(pool)
        kwargs = pool.connection_kwargs
        encoder = pool.get_encoder()
        if pool.connection_class is Connection and not encoder.decode_responses:
            client.lean = LeanPool(
                host=kwargs.get("host", "localhost"), port=int(kwargs.get("port", 6379)),
                db=int(kwargs.get("db", 0) or 0), username=kwargs.get("username"),
                password=kwargs.get("password"),
                protocol=int(kwargs.get("protocol") or DEFAULT_RESP_VERSION),
                client_name=kwargs.get("client_name"),
                connect_timeout=kwargs.get("socket_connect_timeout"),
                socket_timeout=kwargs.get("socket_timeout"), max_connections=max_connections,
                wait_timeout=wait_timeout, encoder=encoder)
        return client

    async def execute_command(self, *args, **options):
        """EVALSHA (a `Script` call: the token buckets, the idempotency claims, the lease's
        early give-back) as a one-command round trip on the lean pool; any other command
        through redis-py. An error reply is raised, as redis-py raises it."""
        if self.lean is None or args[0] != "EVALSHA" or self.single_connection_client:
            return await super().execute_command(*args, **options)
        (reply,) = await self.lean.execute([args])
        if isinstance(reply, ResponseError):
            if EMPTY_RESPONSE in options:
                return options[EMPTY_RESPONSE]
            raise reply
        reply = _parsed(self.response_callbacks, args, options, reply)
        return await reply if inspect.isawaitable(reply) else reply

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        if transaction or shard_hint is not None or self.lean is None:
            return super().pipeline(transaction, shard_hint)
        pipe = LeanPipeline(self.connection_pool, self.response_callbacks, transaction,
                            shard_hint)
        pipe.lean = self.lean
        return pipe

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        if self.lean is not None:
            self.lean.close()
        await super().aclose(close_connection_pool)
