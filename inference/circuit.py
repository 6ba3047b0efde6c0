"""A circuit breaker per replica, its state in Redis so every platform process shares it.

closed --(`failure_threshold` consecutive failures)--> open --(`cooldown_s` passes)--> half-open
half-open: exactly one request (the half-open trial) may go; its success closes the circuit, its
failure opens it for another cool-down. A trial whose process died releases its claim after
`trial_timeout_s`, so another request may be the trial.

A failure is a replica fault (unreachable, stream error), before or after the first token; a
refused input (a client error), one request failing inside a working replica and a client
disconnect are neither failure nor success. A success is a first token received. A replica
whose engine died is tripped open at once (`trip`), without waiting for more failures.
"""
from __future__ import annotations

from typing import Callable, Iterator, Sequence
from common import redis_keys

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
STATE_VALUES = {CLOSED: 0, OPEN: 1, HALF_OPEN: 2}

# KEYS[1] = circuit hash; ARGV: now_ms, threshold, cooldown_ms. Returns 1 when this failure
# opened (or re-opened) the circuit.
_FAILURE = """
local failures = redis.call('HINCRBY', KEYS[1], 'failures', 1)
local open_until = tonumber(redis.call('HGET', KEYS[1], 'open_until') or '0')
local now = tonumber(ARGV[1])
if open_until > 0 and now >= open_until then
  -- half-open: the trial (or a request started before the circuit opened) failed
  redis.call('HSET', KEYS[1], 'open_until', now + tonumber(ARGV[3]))
  redis.call('DEL', KEYS[2])
  return 1
end
if open_until == 0 and failures >= tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], 'open_until', now + tonumber(ARGV[3]))
  return 1
end
return 0
"""


class CircuitBreaker:
    def __init__(self, redis, key_prefix: str, clock: Callable[[], float], *,
                 failure_threshold: int, cooldown_s: float, trial_timeout_s: float):
        self._redis = redis
        self._prefix = key_prefix
        self._clock = clock  # wall-clock seconds (compared across processes)
        self.failure_threshold = failure_threshold
        self._cooldown_ms = int(cooldown_s * 1000)
        self._trial_timeout_ms = int(trial_timeout_s * 1000)
        self._failure = redis.register_script(_FAILURE)

    def key(self, replica_id: int) -> str:
        return redis_keys.circuit(self._prefix, replica_id)

    def half_open_trial_key(self, replica_id: int) -> str:
        return redis_keys.circuit_half_open_trial(self._prefix, replica_id)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def states(self, replica_ids: Sequence[int]) -> dict[int, str]:
        pipe = self._redis.pipeline(transaction=False)
        parse = self.queue_states(pipe, replica_ids)
        return parse(iter(await pipe.execute()))

    def queue_states(self, pipe, replica_ids: Sequence[int]):
        """Queue the reads of `states` on `pipe` (one round trip with the router's other
        reads); returns the parser of the results: it takes an iterator over all of the
        pipeline's results and consumes its own, in order. The parser's `clean` set (filled
        when it runs) holds the replicas with no circuit state at all (no failure since the
        last success): a success there has nothing to reset."""
        for rid in replica_ids:
            pipe.execute_command("HMGET", self.key(rid), "open_until", "failures")

        def parse(rows: Iterator) -> dict[int, str]:
            now = self._now_ms()
            states = {}
            for rid in replica_ids:
                open_until, failures = next(rows)
                until = int(open_until or 0)
                states[rid] = CLOSED if until == 0 else OPEN if now < until else HALF_OPEN
                if open_until is None and failures is None:
                    parse.clean.add(rid)
            return states
        parse.clean = set()
        return parse

    async def try_half_open_trial(self, replica_id: int) -> bool:
        """Claim the single half-open trial of this replica (the caller checked it is half-open)."""
        return bool(await self._redis.set(self.half_open_trial_key(replica_id), "1", nx=True,
                                          px=self._trial_timeout_ms))

    async def record_failure(self, replica_id: int) -> bool:
        """Returns True when this failure opened the circuit."""
        return bool(await self._failure(
            keys=[self.key(replica_id), self.half_open_trial_key(replica_id)],
            args=[self._now_ms(), self.failure_threshold, self._cooldown_ms]))

    async def trip(self, replica_id: int) -> None:
        """Open the circuit now for a cool-down (the replica is known broken: its engine died);
        by then the registry has it failed and the router no longer sees it at all."""
        await self._redis.hset(self.key(replica_id), mapping={
            "failures": self.failure_threshold, "open_until": self._now_ms() + self._cooldown_ms})

    async def record_success(self, replica_id: int) -> None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.delete(self.key(replica_id))
        pipe.delete(self.half_open_trial_key(replica_id))
        await pipe.execute()
