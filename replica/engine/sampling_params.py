"""Sampling parameters, validated once at the boundary.

Every value that passes validation is safe for the sampler: a temperature below
GREEDY_TEMPERATURE is greedy (dividing logits by it would overflow them), top_k above the vocabulary
is "off", and top_p in (0, 1] always keeps the most likely token.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

# Temperatures below this sample greedily. At 1e-5 the largest logit gap of a real model (tens)
# becomes ~1e6 after scaling: the softmax is already one-hot, and float32 is far from overflow.
GREEDY_TEMPERATURE = 1e-5


SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


class InvalidRequestError(ValueError):
    """Raised for a request the engine refuses (bad parameters, prompt too long)."""


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if (not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool)
                or not math.isfinite(self.temperature) or not 0.0 <= self.temperature <= 100.0):
            raise InvalidRequestError(f"temperature must be in [0, 100], got {self.temperature!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise InvalidRequestError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if (not isinstance(self.top_p, (int, float)) or isinstance(self.top_p, bool)
                or not math.isfinite(self.top_p) or not 0.0 < self.top_p <= 1.0):
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not SEED_MIN <= self.seed <= SEED_MAX):
            raise InvalidRequestError(f"seed must be a signed 64-bit integer, got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop must be a list of non-empty strings")
        if len(self.stop) > 16:
            raise InvalidRequestError("at most 16 stop strings")
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in self.stop_token_ids):
            raise InvalidRequestError("stop_token_ids must be non-negative integers")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SamplingParams":
        """Build from a JSON object such as Triton's vLLM backend `sampling_parameters`."""
        if not isinstance(data, dict):
            raise InvalidRequestError("sampling_parameters must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise InvalidRequestError(f"unknown sampling parameters: {sorted(unknown)}")
        kwargs = dict(data)
        try:
            for key in ("max_tokens", "top_k"):
                if key in kwargs and isinstance(kwargs[key], str):
                    kwargs[key] = int(kwargs[key])
            for key in ("temperature", "top_p"):
                if key in kwargs and isinstance(kwargs[key], str):
                    kwargs[key] = float(kwargs[key])
            if "seed" in kwargs and isinstance(kwargs["seed"], str):
                kwargs["seed"] = int(kwargs["seed"])
            if "ignore_eos" in kwargs and isinstance(kwargs["ignore_eos"], str):
                kwargs["ignore_eos"] = kwargs["ignore_eos"].lower() in ("1", "true", "yes")
        except ValueError as exc:
            raise InvalidRequestError(f"bad sampling parameter: {exc}") from None
        stop = kwargs.get("stop", ())
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(stop, (list, tuple)):
            raise InvalidRequestError("stop must be a string or a list of strings")
        kwargs["stop"] = tuple(stop)
        stop_ids = kwargs.get("stop_token_ids", ())
        if not isinstance(stop_ids, (list, tuple)):
            raise InvalidRequestError("stop_token_ids must be a list of integers")
        kwargs["stop_token_ids"] = tuple(stop_ids)
        if "temperature" in kwargs and isinstance(kwargs["temperature"], int) and not isinstance(kwargs["temperature"], bool):
            kwargs["temperature"] = float(kwargs["temperature"])
        return cls(**kwargs)
