"""The request: the one object that flows through the engine.

A request is `num_computed_tokens` against `token_ids` (prompt + generated so far). Prefill,
chunked prefill, prefix-cache hits, decode and recompute after preemption are all "how many
tokens does this request get this step"; nothing else distinguishes them.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from replica.engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


class ErrorKind(str, enum.Enum):
    """Why a request ended with an error: what the platform may do about it.

    INVALID_INPUT: the request's own input; a client error, the same on every replica.
    INTERNAL: this request failed inside a working engine (the step and the others went on);
      not the replica's fault as a whole, and not worth retrying on another replica.
    ENGINE_DEAD: the engine loop died while the request was open; the replica serves no more.
    """

    INVALID_INPUT = "invalid_input"
    INTERNAL = "internal"
    ENGINE_DEAD = "engine_dead"


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    priority: int = 0  # lower value is served first
    tenant: str = ""  # fair-share unit in the waiting queue
    cache_salt: str = ""  # prefix-cache namespace; "" = shared/public

    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    # Prompt tokens prefilled so far (computed or served from the prefix cache), a high-water
    # mark: a recompute after preemption does not raise it again. What the request is billed for
    # as input, and what replica_prompt_tokens_total sums.
    num_prefilled_tokens: int = 0
    num_preemptions: int = 0
    finish_reason: FinishReason | None = None
    # Hashes of this request's full blocks, filled lazily by the KV manager; index i is the
    # chained hash of token block i.
    block_hashes: list[int] = field(default_factory=list)

    @property
    def token_ids(self) -> list[int]:
        if not self.output_token_ids:
            return self.prompt_token_ids
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """token_ids[start:end] without building the whole list (the hot path of decode)."""
        n = len(self.prompt_token_ids)
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        if end <= n:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED


@dataclass
class RequestOutput:
    """One delta for one request after one engine step.

    `num_prompt_tokens` is the request's prompt tokens prefilled so far (`num_prefilled_tokens`):
    the whole prompt once a token was sampled, fewer for a request aborted mid-prefill.
    `num_cached_tokens` never exceeds it."""

    request_id: str
    new_token_ids: list[int]
    text_delta: str
    finished: bool
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    error: str | None = None  # set on a final output that ended in an error
    error_kind: ErrorKind | None = None  # set with `error`
