"""Redis pipelines that run Lua scripts in one round trip.

redis-py asks `SCRIPT EXISTS` before executing any pipeline that holds a registered script
(`Script(..., client=pipe)`): one more round trip on every execute. Here a pipeline queues the
scripts' EVALSHA itself (`queue_script`), and `execute` loads the scripts and runs the
pipeline again only when Redis answers NOSCRIPT (it restarted or flushed its script cache): a
rare second run, which repeats the pipeline's other commands, so they must bear running twice
(reads, SETs, counters that may count once more).
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Sequence, TypeVar

from redis.exceptions import NoScriptError, RedisError

T = TypeVar("T")


def queue_script(pipe, script, keys: Sequence, args: Sequence) -> None:
    """EVALSHA of a registered script (`redis.register_script`) queued on `pipe`: the raw
    command (redis-py's `evalsha` method only builds the same arguments, in three calls)."""
    pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)


async def run_script(script, keys: Sequence, args: Sequence):
    """`script(keys=keys, args=args)` for a registered script (`redis.register_script`) on the
    client it was registered with, without redis-py's per-call import and client checks:
    EVALSHA, and on NOSCRIPT (Redis restarted or flushed its scripts) the script loaded and
    run again, as redis-py's `Script` does."""
    client = script.registered_client
    try:
        return await client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
    except NoScriptError:
        script.sha = await client.script_load(script.script)
        return await client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)


async def execute(redis, build: Callable[[object], T], scripts: Sequence) -> tuple[list, T]:
    """Run the commands `build(pipe)` queues on a fresh pipeline of `redis` in one round trip;
    returns (the results, what `build` returned). `scripts`: those `build` may queue with
    `queue_script` (loaded, and the pipeline run again, on NOSCRIPT)."""
    for attempt in (1, 2):
        pipe = redis.pipeline(transaction=False)
        built = build(pipe)
        try:
            return await pipe.execute(), built
        except NoScriptError:
            if attempt == 2:
                raise
            for script in scripts:
                await redis.script_load(script.script)
    raise AssertionError("unreachable")


Finish = Callable[[list], Awaitable[None]]


class Batch:
    """Commands of several parts (each its own module's) on one pipeline: one round trip.

    `add(queue)` calls `queue(batch)`, which queues its commands (`batch.pipe`, or
    `batch.script` for a registered script) and returns a `finish(results)` (or None), awaited
    by `execute` with that part's own results, or with `[exc]` when the whole pipeline failed.
    A script Redis answers NOSCRIPT for (it restarted or flushed its cache) is run again on its
    own; nothing else is sent twice. Errors of single commands come back as exceptions among
    the results (never raised)."""

    def __init__(self, redis):
        self.pipe = redis.pipeline(transaction=False)
        self._scripts: dict[int, tuple] = {}  # command index -> (script, keys, args)
        self._parts: list[tuple[int, int, Finish]] = []

    def script(self, script, keys: Sequence, args: Sequence) -> None:
        self._scripts[len(self.pipe.command_stack)] = (script, list(keys), list(args))
        queue_script(self.pipe, script, keys, args)

    def add(self, queue: Callable[["Batch"], Finish | None]) -> None:
        start = len(self.pipe.command_stack)
        finish = queue(self)
        if finish is not None:
            self._parts.append((start, len(self.pipe.command_stack), finish))

    async def execute(self, timeout_s: float) -> None:
        """Send, then await every part's `finish`. Past `timeout_s` the pipeline counts as
        failed (its commands may still have run: a part's fallback must bear that)."""
        try:
            if self.pipe.command_stack:
                async with asyncio.timeout(timeout_s):  # no task of its own, as wait_for's
                    results = await self.pipe.execute(raise_on_error=False)
            else:
                results = []
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            for _, _, finish in self._parts:
                await finish([exc])
            return
        for index, (script, keys, args) in self._scripts.items():
            if isinstance(results[index], NoScriptError):
                try:
                    results[index] = await script(keys=keys, args=args)
                except (RedisError, OSError) as exc:
                    results[index] = exc
        for start, end, finish in self._parts:
            await finish(results[start:end])
