"""Redis pipelines that run Lua scripts in one round trip.

redis-py asks `SCRIPT EXISTS` before executing any pipeline that holds a registered script
(`Script(..., client=pipe)`): one more round trip on every execute. Here a pipeline queues the
scripts' EVALSHA itself (`queue_script`), and `execute` loads the scripts and runs the
pipeline again only when Redis answers NOSCRIPT (it restarted or flushed its script cache): a
rare second run, which repeats the pipeline's other commands, so they must bear running twice
(reads, SETs, counters that may count once more).
"""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

from redis.exceptions import NoScriptError

T = TypeVar("T")


def queue_script(pipe, script, keys: Sequence, args: Sequence) -> None:
    """EVALSHA of a registered script (`redis.register_script`) queued on `pipe`."""
    pipe.evalsha(script.sha, len(keys), *keys, *args)


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
