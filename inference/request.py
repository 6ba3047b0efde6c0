"""The typed records that pass between the request path's steps (no behaviour, no I/O).

    view -> prepare (pipeline.Preparation)  -> PreparedRequest | Replayed
         -> admit, route and stream, finish (generation.Generation) -> Delta ... Done(Result)
         -> relay (SSE / WebSocket frames, relay.py)

Each step gets one of these from the step before it and returns the next; none calls back into
the one that called it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

from inference.idempotency import Claim
from inference.quota import Charge
from inference.schemas import GenerationRequest
from models_registry.selectors import ServingVersion
from tenants.auth import Principal


@dataclass(frozen=True)
class Prompt:
    """The request's prompt as the serving version's tokenizer renders and encodes it."""

    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class PreparedRequest:
    """A request that passed authentication, validation, the quota check and its
    Idempotency-Key claim: everything the generation needs, nothing it must look up again."""

    request_id: str
    principal: Principal
    target: ServingVersion
    request: GenerationRequest
    prompt_text: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    claim: Claim | None  # None: no Idempotency-Key
    charge: Charge  # what the tenant's buckets were charged (corrected when the request ends)
    # Canary rollouts: `target` is the canary; `fallback` (stable) serves the request if no
    # canary replica can (inference/canary.py, VersionChooser.fall_back). None: `target` is
    # the only version to try.
    fallback: ServingVersion | None = None
    rollout_id: int | None = None

    @property
    def quota_headers(self) -> dict[str, str]:
        return self.charge.headers


@dataclass(frozen=True)
class Replayed:
    """An Idempotency-Key seen before: its stored reply, nothing charged."""

    request: GenerationRequest
    result: dict
    quota_headers: dict[str, str]  # the buckets as they are: a replay charges nothing


class Delta(NamedTuple):
    """Text the replica produced; several tokens that arrived together are one Delta. A named
    tuple, as ReplicaChunk (inference/replica_client.py): one is built per token."""

    text: str


@dataclass
class Result:
    """The reply, in a form every response format renders and the idempotency store keeps."""

    id: str
    created: int
    model: str
    deltas: list[str]
    finish_reason: str
    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0

    @property
    def text(self) -> str:
        return "".join(self.deltas)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Result":
        return cls(**data)


@dataclass(frozen=True)
class Done:
    result: Result
