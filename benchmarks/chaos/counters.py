"""CounterLedger: the tokens the replicas say they computed, across restarts.

A replica's counters (replica_prompt_tokens_total, replica_generated_tokens_total, ...) live in
its tritonserver process and die with it. So the ledger keeps one entry per incarnation: the
counters at its start and read again just before it is SIGKILLed (or at the end, once every
replica is idle). computed = sum over incarnations of (last read - start - direct tokens).

Tokens that never go through the API are not billed and are taken out: each incarnation's
warm-up (one generation straight to the replica, as a node agent does). A replica started
with the platform is read after its warm-up, before the API process exists (start = that
read); a replica restarted under load may take API traffic the moment it is ready, so its start
is zero (a fresh tritonserver's counters are) and its warm-up's own count, from the warm-up's
final response, is subtracted (`direct`). Health checks (readiness) and the reaper's usage
queries compute no token.

What this misses, stated rather than hidden: tokens a replica computes between the last read
and the SIGKILL (the kill follows the read within milliseconds; at most the steps of that
moment). replica_prompt_tokens_total sums each request's prefilled prompt tokens, prefix-cache
hits included and a recompute after preemption not counted again (replica/engine/request.py
`num_prefilled_tokens`): what a request is billed as input. `prefix_hit_tokens` (a retried
cut stream's prompt found in the cache, say) and `preemptions` are reported alongside.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from benchmarks.chaos.stack import Replica
from inference.replica_signals import parse_metrics

FIELDS = ("prompt_tokens", "generated_tokens", "prefix_hit_tokens", "preemptions")


def read_counters(replica: Replica) -> dict[str, int]:
    signals = parse_metrics(replica.metrics_text())
    return {name: getattr(signals, name) or 0 for name in FIELDS}


def read_activity(replica: Replica) -> int:
    """Sequences running or waiting on the replica now."""
    signals = parse_metrics(replica.metrics_text())
    return (signals.running_seqs or 0) + (signals.waiting_seqs or 0)


@dataclass
class Incarnation:
    replica: int
    first: dict[str, int]
    last: dict[str, int] | None = None
    ended_by: str = ""  # "sigkill" | "end of run"
    direct: dict[str, int] = field(default_factory=dict)  # not via the API: not billed

    def delta(self) -> dict[str, int]:
        last = self.last or self.first
        return {name: last[name] - self.first[name] - self.direct.get(name, 0)
                for name in FIELDS}


@dataclass
class CounterLedger:
    incarnations: list[Incarnation] = field(default_factory=list)
    _open: dict[int, Incarnation] = field(default_factory=dict)

    def open_incarnation(self, replica: Replica) -> None:
        """A replica started with the platform: read after its warm-up, before any load."""
        inc = Incarnation(replica.index, read_counters(replica))
        self.incarnations.append(inc)
        self._open[replica.index] = inc

    def open_restarted(self, replica: Replica) -> None:
        """A replica restarted under load: from zero, less its warm-up's tokens."""
        inc = Incarnation(replica.index, {name: 0 for name in FIELDS},
                          direct=dict(replica.warmups[-1]))
        self.incarnations.append(inc)
        self._open[replica.index] = inc

    def close_incarnation(self, replica: Replica, ended_by: str = "sigkill") -> dict | None:
        """The last read; None (and the incarnation marked unreadable: its tokens are then
        missing from the total) when the replica's metrics port does not answer."""
        inc = self._open.pop(replica.index)
        inc.ended_by = ended_by
        try:
            inc.last = read_counters(replica)
        except httpx.HTTPError as exc:
            inc.ended_by += f" (counters unreadable: {type(exc).__name__})"
        return inc.last

    @property
    def complete(self) -> bool:
        return all(inc.last is not None for inc in self.incarnations)

    def close_all(self, replicas: list[Replica]) -> None:
        for replica in replicas:
            if replica.index in self._open:
                self.close_incarnation(replica, "end of run")

    def totals(self) -> dict[str, int]:
        out = {name: 0 for name in FIELDS}
        for inc in self.incarnations:
            for name, value in inc.delta().items():
                out[name] += value
        return out

    def as_json(self) -> list[dict]:
        return [{"replica": inc.replica, "first": inc.first, "last": inc.last,
                 "direct_warmup": inc.direct, "ended_by": inc.ended_by or "still open",
                 "delta": inc.delta()}
                for inc in self.incarnations]
