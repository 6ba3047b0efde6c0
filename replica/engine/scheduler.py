"""Continuous batching: which requests get how many tokens this step.

Every step mixes decode tokens and (chunked) prefill under a token budget and a sequence cap.
Running requests go first (in priority order); then waiting requests are admitted ordered by
priority (lower value first), then fair share (the tenant served the fewest weighted tokens),
then arrival. When blocks run out a running request is preempted by recompute: the victim is
the lowest-priority, latest-arrived running request.

Tenants are isolated before the engine: the platform's admission queue gives each tenant its
fair share of a replica's slots, so a bursting tenant holds only its share of the batch; inside
the engine fair share orders the waiting queue and nothing else. (Newcomer isolation, which
held a burst's work back for the step that started a lighter tenant's request, and step
interruption, which cut a step under way short from inside the model's forward, were measured
with benchmarks.fairness and removed: benchmarks/README.md, "fairness".)

Invariants:
- a request is in exactly one of `waiting`, `running`, or neither (finished);
- every scheduled request has blocks for `num_computed_tokens + num_new_tokens`;
- a request that alone needs more than the whole pool is finished with `length`, never left
  to wait forever (no deadlock); waiting requests are only ever overtaken by higher priority or
  by less-served tenants, whose counters then grow (no starvation).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from replica.engine.kv.manager import KVCacheManager
from replica.engine.request import FinishReason, Request, RequestStatus


@dataclass
class SchedulerOutput:
    # (request, number of tokens to compute this step), in batch order
    scheduled: list[tuple[Request, int]]
    block_tables: dict[str, list[int]]
    num_batched_tokens: int
    preempted_ids: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class FairShareWeights:
    prompt_token: float = 1.0
    output_token: float = 2.0


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        weights: FairShareWeights | None = None,
    ) -> None:
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # a sequence can never outgrow the whole pool
        self.max_seq_len = min(max_model_len, kv.num_blocks * kv.block_size)
        self.weights = weights or FairShareWeights()
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.tenant_served: dict[str, float] = {}
        self.num_preemptions = 0
        self.prefix_hit_tokens = 0
        self.prefilled_tokens = 0  # cumulative sum of the requests' num_prefilled_tokens

    # --- admission -------------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        active = {r.tenant for r in self.requests.values()}
        if request.tenant not in active:
            # A tenant returning from idle starts level with the least-served active tenant:
            # idle time banks no credit (virtual-time fair queueing).
            floor = min((self.tenant_served.get(t, 0.0) for t in active), default=0.0)
            self.tenant_served[request.tenant] = max(self.tenant_served.get(request.tenant, 0.0), floor)
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # --- one step --------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        scheduled: dict[str, int] = {}
        preempted: list[str] = []
        self.waiting.sort(key=self._waiting_key)
        self.running.sort(key=_priority_key)
        self._schedule_running(scheduled, preempted)
        # after a preemption the pool is under pressure: admit nothing new this step
        if not preempted:
            self._admit_waiting(self._budget_left(scheduled), scheduled, preempted)

        batch = [(self.requests[rid], n) for rid, n in scheduled.items()]
        return SchedulerOutput(
            scheduled=batch,
            block_tables={rid: self.kv.block_table(rid) for rid in scheduled},
            num_batched_tokens=sum(scheduled.values()),
            preempted_ids=preempted,
        )

    def _budget_left(self, scheduled: dict[str, int]) -> int:
        return self.max_num_batched_tokens - sum(scheduled.values())

    def _schedule_running(self, scheduled: dict[str, int], preempted: list[str]) -> None:
        """Schedule the running requests (priority order); when blocks run out, preempt the
        worst running request."""
        budget = self._budget_left(scheduled)
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if num_new <= 0:
                i += 1
                continue
            while not self.kv.allocate(request, num_new):
                victim = max(self.running, key=_priority_key)
                if self.running.index(victim) < i:
                    i -= 1  # keep `i` on `request` after the list shrinks
                budget += scheduled.pop(victim.request_id, 0)
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    break
            else:
                scheduled[request.request_id] = num_new
                budget -= num_new
                i += 1

    def _admit_waiting(self, budget: int, scheduled: dict[str, int], preempted: list[str]) -> None:
        """Admit waiting requests in order while budget, sequence slots and blocks allow."""
        while self.waiting and budget > 0:
            request = self.waiting[0]
            if len(self.running) >= self.max_num_seqs:
                if not self._make_room_for(request, scheduled, preempted):
                    break
                budget = self.max_num_batched_tokens - sum(scheduled.values())
                continue
            cached = self.kv.match(request) if request.num_computed_tokens == 0 else []
            num_cached_tokens = len(cached) * self.kv.block_size
            num_new = min(request.num_tokens - request.num_computed_tokens - num_cached_tokens, budget)
            if not self.kv.can_allocate(request, num_new, cached):
                if not self._make_room_for(request, scheduled, preempted):
                    break
                budget = self.max_num_batched_tokens - sum(scheduled.values())
                continue  # re-match: the victim's blocks may have changed the cache picture
            self.kv.allocate(request, num_new, cached)
            if request.num_preemptions == 0 and request.num_cached_tokens == 0:
                request.num_cached_tokens = num_cached_tokens
            self.prefix_hit_tokens += num_cached_tokens
            self.waiting.pop(0)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled[request.request_id] = num_new
            budget -= num_new

    def _make_room_for(self, request: Request, scheduled: dict[str, int], preempted: list[str]) -> bool:
        """Preempt the worst running request if it ranks strictly below `request`."""
        if not self.running:
            return False
        victim = max(self.running, key=_priority_key)
        if victim.priority <= request.priority:
            return False
        scheduled.pop(victim.request_id, None)
        self._preempt(victim)
        preempted.append(victim.request_id)
        return True

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.PREEMPTED
        self.waiting.append(request)
        self.num_preemptions += 1

    def _waiting_key(self, request: Request):
        return (request.priority, self.tenant_served.get(request.tenant, 0.0), request.arrival_time)

    # --- after the model ran ---------------------------------------------------------------

    def update(self, output: SchedulerOutput, sampled: dict[str, int], eos_token_ids: tuple[int, ...]) -> list[Request]:
        """Advance computed counts, append sampled tokens, finish what is done.

        `sampled` maps request id -> new token for requests whose step reached the end of their
        known tokens. Returns the requests that got a new token (finished ones included)."""
        progressed = []
        for request, num_new in output.scheduled:
            if request.is_finished:
                continue
            was_prefill = request.num_computed_tokens < request.num_prompt_tokens
            request.num_computed_tokens += num_new
            self._count_prefilled(request)
            weight = self.weights.prompt_token if was_prefill else self.weights.output_token
            self.tenant_served[request.tenant] = self.tenant_served.get(request.tenant, 0.0) + weight * num_new
            self.kv.cache_full_blocks(request)
            token = sampled.get(request.request_id)
            if token is None:
                continue
            request.output_token_ids.append(token)
            progressed.append(request)
            reason = self._check_stop(request, token, eos_token_ids)
            if reason is not None:
                self.finish(request, reason)
        return progressed

    def _count_prefilled(self, request: Request) -> None:
        prefilled = min(request.num_computed_tokens, request.num_prompt_tokens)
        if prefilled > request.num_prefilled_tokens:
            self.prefilled_tokens += prefilled - request.num_prefilled_tokens
            request.num_prefilled_tokens = prefilled

    def _check_stop(self, request: Request, token: int, eos_token_ids: tuple[int, ...]) -> FinishReason | None:
        params = request.sampling_params
        if not params.ignore_eos and token in eos_token_ids:
            return FinishReason.STOP
        if token in params.stop_token_ids:
            return FinishReason.STOP
        if request.num_output_tokens >= params.max_tokens or request.num_tokens >= self.max_seq_len:
            return FinishReason.LENGTH
        return None

    def finish(self, request: Request, reason: FinishReason) -> None:
        if request.is_finished:
            return
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        self.requests.pop(request.request_id, None)


def _priority_key(request: Request):
    return (request.priority, request.arrival_time)
