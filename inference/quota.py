"""Quota admission on the request path: estimate -> charge -> headers; correct at the end.

The estimate is prompt tokens + max_tokens. `admit` charges it to the tenant's buckets or
raises 429 (Retry-After: whole seconds until this request would fit), 400 (the estimate can
never fit the token bucket) or 403 `tenant_suspended` (a limit of 0: nothing ever fits).
`settle` corrects the tokens bucket with what the request used.
`current_headers` reports the buckets without charging, for replies that never reach `admit`.
"""
from __future__ import annotations

from dataclasses import dataclass

from inference.errors import Forbidden, InvalidRequest, RateLimited
from inference.key_ratelimit import KeyRate, refusal
from tenants.buckets import BucketState, TokenBuckets
from tenants.selectors import Limits


def format_duration(seconds: float) -> str:
    """OpenAI's reset format: `6m0s`, `1s`, `250ms`."""
    ms = int(round(seconds * 1000))
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest_ms = divmod(ms, 60_000)
    secs = rest_ms / 1000.0
    text = f"{secs:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{text}s" if minutes else f"{text}s"


def rate_limit_headers(state: BucketState) -> dict[str, str]:
    limits = state.limits
    return {
        "x-ratelimit-limit-requests": str(limits.requests_per_minute),
        "x-ratelimit-remaining-requests": str(max(0, int(state.requests_level))),
        "x-ratelimit-reset-requests": format_duration(state.reset_requests_s()),
        "x-ratelimit-limit-tokens": str(limits.tokens_per_minute),
        "x-ratelimit-remaining-tokens": str(max(0, int(state.tokens_level))),
        "x-ratelimit-reset-tokens": format_duration(state.reset_tokens_s()),
    }


async def current_headers(buckets: TokenBuckets, limits: Limits) -> dict[str, str]:
    """The headers of a reply that charges nothing (a replay, a refusal before the check)."""
    return rate_limit_headers(await buckets.peek(limits))


@dataclass(frozen=True)
class Charge:
    """What a request was charged at admission; `settle` corrects it."""

    limits: Limits
    estimated_tokens: int
    headers: dict[str, str]


async def admit(buckets: TokenBuckets, limits: Limits, num_prompt_tokens: int,
                max_tokens: int, key_rate: KeyRate | None = None) -> Charge:
    """`key_rate`: the request's count against its API key's rate, counted in the same call
    as the buckets (over the rate: 429 api_key_rate_exceeded, nothing charged)."""
    if limits.suspended:
        # 403, not 429: waiting never helps, and clients retry a 429 on their own.
        raise Forbidden(
            f"This tenant is suspended: its limits are {limits.requests_per_minute} "
            f"requests/min (burst {limits.request_burst}) and {limits.tokens_per_minute} "
            f"tokens/min (burst {limits.token_burst}), so no request can be admitted. Ask the "
            "platform's operators to restore them.", code="tenant_suspended")
    estimate = num_prompt_tokens + max_tokens
    if estimate > limits.token_burst:
        raise InvalidRequest(
            f"This request needs up to {estimate} tokens (prompt {num_prompt_tokens} + "
            f"max_tokens {max_tokens}), more than your token bucket can ever hold "
            f"({limits.token_burst} tokens; {limits.tokens_per_minute} tokens/min). Lower "
            "max_tokens or shorten the prompt.",
            code="tokens_exceed_limit", param="max_tokens")
    count = None
    if key_rate is not None:
        key_rate.counted, count = True, key_rate.count
    state = await buckets.check(limits, estimate, count)
    if state.window_retry_ms >= 0:
        raise refusal(state.window_retry_ms)
    headers = rate_limit_headers(state)
    if not state.admitted:
        which = "requests" if state.requests_level < 1 else "tokens"
        raise RateLimited(
            f"Rate limit reached for {which} ({limits.requests_per_minute} requests/min, "
            f"{limits.tokens_per_minute} tokens/min; this request needs {estimate} tokens). "
            f"Retry in {state.retry_after_s} s.",
            headers={**headers, "Retry-After": str(state.retry_after_s)}, error_type=which)
    return Charge(limits=limits, estimated_tokens=estimate, headers=headers)


async def settle(buckets: TokenBuckets, charge: Charge, used_tokens: int) -> float:
    """Refund the unused part of the estimate, or charge the excess (may go below zero)."""
    return await buckets.correct(charge.limits, used_tokens - charge.estimated_tokens)
