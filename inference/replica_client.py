"""What the platform needs from a replica, independent of the wire protocol.

Invariants of `ReplicaClient.stream`:
- chunks arrive in order; exactly one has `final=True` and it is the last;
- closing the iterator early (aclose, or cancelling the task that awaits it) cancels the
  request on the replica, which frees its sequence;
- `usage` is the replica's own count of what it computed for a request (billing, when the
  stream ended without its final chunk, or its platform process died);
- failures raise `ReplicaUnavailable` (never reached / connection lost / draining),
  `ReplicaDead` (its engine died: the replica serves nothing more), `ReplicaRejected` (the
  replica refused the input: a client error), `ReplicaRequestFailed` (this request failed
  inside a working replica) or `ReplicaStreamError` (anything else).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, NamedTuple, Protocol


@dataclass(frozen=True)
class ReplicaRequest:
    request_id: str
    model_name: str  # the model's name in the replica's Triton repository
    prompt_text: str
    prompt_token_ids: tuple[int, ...] | None  # sent as `input_ids` when given
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    priority: int  # lower first
    tenant: str  # the engine's fair-share unit
    cache_salt: str = ""  # prefix-cache isolation; "" = the tenant


class ReplicaChunk(NamedTuple):
    """One response of a request's stream. A named tuple, not a frozen dataclass: one is built
    per token read off a replica's call, and a tuple is built in about a third of the time
    (0.19 against 0.51 us on a 2-vCPU EPYC: a frozen dataclass sets each field with
    object.__setattr__)."""

    text: str  # the text delta (may be empty)
    finish_reason: str  # "" until the final chunk, then stop | length | abort
    num_input_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    final: bool


@dataclass(frozen=True)
class ReplicaUsage:
    """What a replica computed for one request id (its usage ledger)."""

    state: str  # running | finished | unknown (never seen, or fallen out of the ledger)
    input_tokens: int = 0  # prompt tokens prefilled, prefix-cache hits included
    cached_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = ""
    error: str = ""


class ReplicaError(Exception):
    pass


class ReplicaUnavailable(ReplicaError):
    pass


class ReplicaRejected(ReplicaError):
    pass


class ReplicaStreamError(ReplicaError):
    pass


class ReplicaDead(ReplicaUnavailable):
    """The replica's engine died. `in_flight`: it died while serving this request (which may
    have been what killed it, so it is not retried elsewhere); otherwise it refused the request
    because it was already dead."""

    def __init__(self, message: str, *, in_flight: bool):
        super().__init__(message)
        self.in_flight = in_flight


class ReplicaRequestFailed(ReplicaError):
    """This request failed inside a working replica (the others there went on): not the
    replica's fault as a whole, and the same request would likely fail on another one."""


class ReplicaClient(Protocol):
    def stream(self, address: str, request: ReplicaRequest) -> AsyncIterator[ReplicaChunk]: ...

    async def usage(self, address: str, model_name: str, request_ids: list[str], *,
                    abort: bool = False, wait_s: float = 0.0) -> dict[str, ReplicaUsage]:
        """The replica's usage ledger for `request_ids`; with `abort`, abort them first; waits
        up to `wait_s` for them to finish. Raises ReplicaError when the replica cannot say."""
        ...

    async def close(self) -> None: ...
