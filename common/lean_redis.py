"""Pipelines and EVALSHA calls sent over one lean, auto-pipelined connection: redis-py's
commands and reply callbacks, without redis-py's per-call machinery.

redis-py 8 spends about 60 us of CPU on every pipeline it sends, besides the commands: the pool
checkout (an asyncio.Condition, a timeout, a connection check), observability hooks, HIMPORT
bookkeeping, the retry wrapper and the release; and each round trip is a send and a receive
system call of its own (a loopback TCP send costs tens of microseconds of the sender's CPU
here: the receiver's TCP work runs in it). `LeanRedis` is a redis-py asyncio client whose plain
pipelines (`pipeline(transaction=False)`, without redis-py `Script` objects: common/pipelines.py
queues EVALSHA itself) and single EVALSHA calls (what a `Script` call sends) are queued by
redis-py's own methods, so the commands, their arguments (encoded by the pool's encoder) and
the reply callbacks are redis-py's, and sent by a `LeanPool`: one connection per client (per
event loop), on which every batch submitted while the loop runs one iteration goes out in one
write and the replies, in the same order, come back to one reader task (auto-pipelining, as
ioredis and others do). With `flush_batches` > 0, each `flush_batches` batches queued in one
iteration are written at once instead of at its end, so that Redis runs the first ones while
the loop is still making the rest (a burst's requests reach the same round trip together, and
the loop would otherwise wait for Redis to run all of them; REDIS_LEAN_FLUSH_BATCHES, round
frontdoor22 in benchmarks/README.md). What holds as with redis-py's pool
(llm_platform/redis_clients.py):

- an error reply of one command is that command's result (a `ResponseError`, `NoScriptError`
  for NOSCRIPT, parsed as redis-py parses it), raised first with `raise_on_error`; a single
  EVALSHA raises it (a `Script` then loads itself and runs again on NOSCRIPT);
- a connection that fails raises `redis.ConnectionError`, and a caller's batch is sent once
  more on a new connection (a connection that died while idle, Redis restarted); a reply later
  than `socket_timeout` raises `redis.TimeoutError`, never retried, and gives the connection up:
  every batch waiting on it fails at once with the same error (a hung Redis costs one timeout);
- a caller cancelled while waiting leaves its replies to be read and dropped (the connection
  stays in step).

Other single commands, transactions, pub/sub and blocking reads go through redis-py unchanged,
and so does everything of a client whose pool is not a plain TCP one (TLS, a Unix socket) or
that decodes replies.
"""
from __future__ import annotations

import asyncio
import inspect
import socket
from collections import deque
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
# A RESP3 push message (none is asked for on this connection, but one that came would not be
# a reply to any batch): skipped.
_PUSH = getattr(hiredis, "PushNotification", None)


class _Batch:
    """One caller's commands: written together, answered by the next `count` replies."""

    __slots__ = ("packed", "count", "future", "replies")

    def __init__(self, packed: bytes, count: int, future: asyncio.Future):
        self.packed, self.count, self.future = packed, count, future
        self.replies: list = []


class LeanConnection:
    """One connection shared by every caller: batches are written in the order they come and
    their replies, which Redis sends in that order, handed back by one reader task."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader = reader
        self._writer = writer
        self._parser = hiredis.Reader(protocolError=InvalidResponse,
                                      replyError=BaseParser.parse_error,
                                      notEnoughData=_NOT_ENOUGH)
        self._waiting: deque[_Batch] = deque()  # written, not yet answered
        self._reading: asyncio.Task | None = None
        self.broken: BaseException | None = None

    def send(self, packed: bytes) -> None:
        self._writer.write(packed)

    async def replies(self, count: int) -> list:
        """The next `count` replies (the handshake, before the reader task runs)."""
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

    def start(self) -> None:
        self._reading = asyncio.get_running_loop().create_task(self._read())

    def write(self, batches: list[_Batch]) -> None:
        self._waiting.extend(batches)
        try:
            self.send(b"".join(batch.packed for batch in batches))
        except Exception as exc:  # noqa: BLE001 - a transport already closed: they go again
            self.fail(RedisConnectionError(f"Error while writing to Redis: {exc!r}"))

    async def _read(self) -> None:
        parser, reader, waiting = self._parser, self._reader, self._waiting
        try:
            while True:
                data = await reader.read(_READ_SIZE)
                if not data:
                    raise RedisConnectionError("Connection closed by server.")
                parser.feed(data)
                while True:
                    reply = parser.gets()
                    if reply is _NOT_ENOUGH:
                        break
                    if _PUSH is not None and isinstance(reply, _PUSH):
                        continue
                    if not waiting:
                        raise InvalidResponse("a reply nobody asked for")
                    batch = waiting[0]
                    batch.replies.append(reply)
                    if len(batch.replies) == batch.count:
                        waiting.popleft()
                        if not batch.future.done():  # its caller may have given up
                            batch.future.set_result(batch.replies)
        except asyncio.CancelledError:
            self.fail(RedisConnectionError("Connection closed."))
            raise
        except OSError as exc:
            self.fail(RedisConnectionError(f"Error while reading from Redis: {exc!r}"))
        except BaseException as exc:  # noqa: BLE001 - every waiting caller gets it
            self.fail(exc)

    def fail(self, error: BaseException) -> None:
        """Close: every batch written and not answered fails with `error`."""
        if self.broken is None:
            self.broken = error
        self._writer.close()
        while self._waiting:
            batch = self._waiting.popleft()
            if not batch.future.done():
                batch.future.set_exception(error)
                batch.future.exception()  # retrieved: its caller may be gone
        if self._reading is not None and self._reading is not asyncio.current_task():
            self._reading.cancel()

    def close(self) -> None:
        self.fail(RedisConnectionError("Connection closed."))


class LeanPool:
    """Every round trip of a client (per event loop) on one connection, auto-pipelined: the
    batches callers submit while the event loop runs one iteration go out in one write (or in
    writes of `flush_batches` as they are queued, the rest at the iteration's end), and their
    replies come back in one read, instead of one system call each way per caller (a loopback
    TCP send costs tens of microseconds of the sender's CPU here)."""

    def __init__(self, *, host: str, port: int, db: int, username: str | None,
                 password: str | None, protocol: int, client_name: str | None,
                 connect_timeout: float | None, socket_timeout: float | None, encoder,
                 flush_batches: int = 0):
        self._host, self._port, self._db = host, port, db
        self._username, self._password = username, password
        self._protocol, self._client_name = protocol, client_name
        self._connect_timeout, self._socket_timeout = connect_timeout, socket_timeout
        self._encode = encoder.encode
        # hiredis packs str as UTF-8 and numbers with repr, as the default encoder does.
        self._utf8 = (encoder.encoding, encoder.encoding_errors) == ("utf-8", "strict")
        self._connection: LeanConnection | None = None
        self._connecting: asyncio.Task | None = None
        self._queued: list[_Batch] = []
        self._flush_scheduled = False
        self._flush_batches = max(0, flush_batches)  # 0: one write per loop iteration
        # The socket timeout: one timer for the pool, armed at the oldest unanswered batch's
        # deadline (batches come in deadline order), instead of an asyncio.timeout (a Timeout,
        # a TimerHandle, a heap push and a cancel) around every round trip.
        self._deadlines: deque[tuple[float, _Batch]] = deque()
        self._watch: asyncio.TimerHandle | None = None

    def pack(self, commands: list[tuple]) -> bytes:
        """The commands as redis-py writes them (a first argument with spaces is split, every
        argument encoded by the pool's encoder)."""
        pack, encode, parts = hiredis.pack_command, self._encode, []
        for args in commands:
            name = args[0]
            if isinstance(name, str) and " " in name:
                args = (*name.split(), *args[1:])
            if self._utf8:
                try:  # str, bytes, int and float written as the encoder writes them
                    parts.append(pack(args))
                    continue
                except TypeError:  # a bool (the encoder refuses it too), a memoryview
                    pass
            parts.append(pack(tuple(bytes(a) if isinstance(a, memoryview) else a
                                    for a in map(encode, args))))
        return b"".join(parts)

    async def execute(self, commands: list[tuple]) -> list:
        """Send the commands and return their replies (error replies as exception instances
        among them). A connection error sends them once more, on a new connection."""
        packed = self.pack(commands)
        for attempt in (1, 2):
            try:
                return await self._round_trip(packed, len(commands))
            except RedisConnectionError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _round_trip(self, packed: bytes, count: int) -> list:
        loop = asyncio.get_running_loop()
        batch = _Batch(packed, count, loop.create_future())
        queued = self._queued
        queued.append(batch)
        # A full group goes out now; the rest of this iteration's batches at its end.
        written = len(queued) == self._flush_batches and self._write_queued()
        if not written and not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        if self._socket_timeout is not None:
            deadlines = self._deadlines
            while deadlines and deadlines[0][1].future.done():  # answered: forgotten
                deadlines.popleft()
            deadlines.append((loop.time() + self._socket_timeout, batch))
            if self._watch is None:
                self._watch = loop.call_at(deadlines[0][0], self._expire)
        return await batch.future

    def _expire(self) -> None:
        """The watch timer: every batch unanswered past its deadline fails with TimeoutError.
        Redis did not answer in time: the connection is given up, and whatever else waits on
        it fails now rather than after its own timeout (a hung Redis costs one timeout, as
        with redis-py's pool)."""
        self._watch = None
        loop = asyncio.get_running_loop()
        now, deadlines = loop.time(), self._deadlines
        while deadlines:
            deadline, batch = deadlines[0]
            if not batch.future.done() and deadline > now:
                break
            deadlines.popleft()
            if batch.future.done():
                continue
            error = RedisTimeoutError("Timeout reading from socket")
            connection = self._connection
            if connection is not None and batch in connection._waiting:
                self._connection = None
                connection.fail(error)  # this batch and every other one written on it
            if not batch.future.done():  # queued, never written (a connect that hangs)
                batch.future.set_exception(error)
        if deadlines:
            self._watch = loop.call_at(deadlines[0][0], self._expire)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._queued or self._write_queued():
            return
        self._connection = None
        if self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._open())
        # written once connected

    def _write_queued(self) -> bool:
        """Write every queued batch whose caller still waits; False (nothing written) without
        a live connection."""
        connection = self._connection
        if connection is None or connection.broken is not None:
            return False
        batches = [b for b in self._queued if not b.future.done()]
        self._queued = []
        if batches:
            connection.write(batches)
        return True

    async def _open(self) -> None:
        try:
            connection = await self._connect()
        except BaseException as exc:  # noqa: BLE001 - every queued caller gets it
            self._connecting = None
            cancelled = isinstance(exc, asyncio.CancelledError)  # `close` while connecting
            error = RedisConnectionError("Connection closed.") if cancelled else exc
            queued, self._queued = self._queued, []
            for batch in queued:
                if not batch.future.done():
                    batch.future.set_exception(error)
                    batch.future.exception()
            if cancelled:
                raise
            return
        self._connecting = None
        self._connection = connection
        connection.start()
        self._flush()

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
        """Close the connection (what waits on it fails with ConnectionError; a later call
        connects again, as redis-py's client does after `aclose`)."""
        if self._connecting is not None:
            self._connecting.cancel()
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._watch is not None:  # a later call arms it again
            self._watch.cancel()
            self._watch = None


def _parsed(callbacks, args: tuple, options: dict, reply):
    """A reply through the client's callback for its command, as redis-py's parse_response
    (which may return an awaitable). redis-py's callbacks dict upper-cases its keys, and its
    commands are named in capitals: a plain dict lookup finds them without the dict's
    per-call upper-casing; any other name is looked up as redis-py would."""
    name = args[0]
    callback = dict.get(callbacks, name)
    if callback is None:
        if type(name) is str and name.isupper():
            return reply
        callback = callbacks.get(name)
        if callback is None:
            return reply
    if options:
        options = {k: v for k, v in options.items()
                   if k not in (EMPTY_RESPONSE, NEVER_DECODE, "keys")}
    return callback(reply, **options)


def _plain(reply) -> bool:
    """Not awaitable, by its type alone (what most replies are), else by inspect's rule."""
    return type(reply) in _PLAIN_REPLIES or not inspect.isawaitable(reply)


_PLAIN_REPLIES = frozenset({bytes, int, list, dict, float, str, bool, type(None), set, tuple})


class LeanPipeline(Pipeline):
    """A redis-py pipeline whose plain form is sent by a `LeanPool` (see the module)."""

    lean: LeanPool

    def execute_command(self, *args, **options):
        """Queued at once: redis-py's goes through `pipeline_execute_command` first (WATCH,
        and any command while watching, still go to redis-py, which runs them at once)."""
        if self.watching or args[0] == "WATCH":
            return super().execute_command(*args, **options)
        self.command_stack.append((args, options))
        return self

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
            errors = False
            for (args, options), reply in zip(stack, replies):
                if isinstance(reply, ResponseError):
                    if EMPTY_RESPONSE in options:
                        response.append(options[EMPTY_RESPONSE])
                    else:
                        response.append(reply)
                        errors = True
                    continue
                reply = _parsed(callbacks, args, options, reply)
                if not _plain(reply):
                    reply = await reply
                response.append(reply)
            if raise_on_error and errors:
                self.raise_first_error(stack, response)
            return response
        finally:
            # redis-py's reset, without its coroutine where it has nothing to undo: this
            # pipeline never watched nor held a connection of redis-py's pool, and its
            # `scripts` is empty (a pipeline holding Scripts is redis-py's, above).
            if self.watching or self.connection is not None:
                await self.reset()
            else:
                self.command_stack = []
                self.explicit_transaction = False


class LeanRedis(aioredis.Redis):
    """A redis-py asyncio client whose plain pipelines and EVALSHA calls go through a
    `LeanPool` (see the module); `lean` is None where that does not apply."""

    lean: LeanPool | None = None

    @classmethod
    def on_pool(cls, pool: aioredis.ConnectionPool, flush_batches: int = 0) -> "LeanRedis":
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
                socket_timeout=kwargs.get("socket_timeout"), encoder=encoder,
                flush_batches=flush_batches)
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
        return reply if _plain(reply) else await reply

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
