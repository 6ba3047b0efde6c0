"""One streaming client for any OpenAI-style `/v1/completions` server (ours, llama-server).

A request streams (`stream: true`, usage asked for with `stream_options`); every chunk that
carries text is a token arrival. TTFT is the time to the first one, inter-token latencies are
the gaps between consecutive ones, output tokens are the server's usage count (the number of
text chunks where a server reports none). Concurrency is closed loop: `concurrency` workers,
each sending its next request when its previous one ends.
"""
from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class Sample:
    ok: bool
    ttft_s: float = 0.0
    output_tokens: int = 0
    itls_s: list[float] = field(default_factory=list)
    error: str = ""


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q % of the values at or below it."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def parse_sse_line(line: str) -> dict | None:
    """A `data: {...}` line's JSON; None for other lines and for `data: [DONE]`."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if not payload or payload == "[DONE]":
        return None
    return json.loads(payload)


async def one_request(http: httpx.AsyncClient, base_url: str, headers: dict, body: dict) -> Sample:
    """One streamed completion. A pooled keep-alive connection the server closed just as the
    request went out ("Server disconnected without sending a response": llama-server closes idle
    connections) is no answer at all: the request is sent again on a fresh connection, twice at
    most, its clock restarted."""
    for attempt in range(3):
        try:
            return await _one_request(http, base_url, headers, body)
        except (httpx.RemoteProtocolError, httpx.ConnectError) as exc:
            if attempt == 2 or not _before_any_response(exc):
                return Sample(False, error=f"{type(exc).__name__}: {exc}"[:200])
    raise AssertionError("unreachable")


def _before_any_response(exc: Exception) -> bool:
    return isinstance(exc, httpx.ConnectError) or "without sending a response" in str(exc)


async def _one_request(http: httpx.AsyncClient, base_url: str, headers: dict, body: dict) -> Sample:
    start = time.perf_counter()
    arrivals: list[float] = []
    usage_tokens = None
    async with http.stream("POST", base_url + "/v1/completions", json=body, headers=headers) as response:
        if response.status_code != 200:
            return Sample(False, error=f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
        async for line in response.aiter_lines():
            chunk = parse_sse_line(line)
            if chunk is None:
                continue
            if "error" in chunk:
                return Sample(False, error=str(chunk["error"])[:200])
            if any(choice.get("text") for choice in chunk.get("choices") or []):
                arrivals.append(time.perf_counter())
            if chunk.get("usage"):
                usage_tokens = chunk["usage"].get("completion_tokens")
    if not arrivals:
        return Sample(False, error="no tokens")
    return Sample(True, ttft_s=arrivals[0] - start, output_tokens=usage_tokens or len(arrivals),
                  itls_s=[b - a for a, b in zip(arrivals, arrivals[1:])])


async def closed_loop(base_url: str, headers: dict, bodies: list[dict], concurrency: int) -> tuple[list[Sample], float]:
    """Every body sent once, `concurrency` in flight; returns the samples and the wall time."""
    queue = list(reversed(bodies))
    samples: list[Sample] = []
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=900, limits=limits) as http:
        async def worker() -> None:
            while queue:
                samples.append(await one_request(http, base_url, headers, queue.pop()))
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return samples, time.perf_counter() - start


def summarize(samples: list[Sample], wall_s: float) -> dict:
    ok = [s for s in samples if s.ok]
    ttfts = [s.ttft_s * 1e3 for s in ok]
    itls = [x * 1e3 for s in ok for x in s.itls_s]
    tokens = sum(s.output_tokens for s in ok)
    return {
        "requests": len(samples), "failed": len(samples) - len(ok),
        "errors": sorted({s.error for s in samples if not s.ok})[:3],
        "output_tokens": tokens, "seconds": round(wall_s, 2),
        "output_tokens_per_s": round(tokens / wall_s, 2) if wall_s > 0 else 0.0,
        "ttft_p50_ms": round(percentile(ttfts, 50), 1), "ttft_p99_ms": round(percentile(ttfts, 99), 1),
        "itl_p50_ms": round(percentile(itls, 50), 1),
    }
