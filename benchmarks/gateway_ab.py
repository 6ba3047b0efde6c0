"""python -m benchmarks.gateway_ab: the API's CPU per short request, two platforms side by side.

On a shared machine the CPU time one request costs moves by half between runs minutes apart
(other jobs, the host's own load), which hides a 10 % change in a before/after pair of
`benchmarks.gateway` runs. Here two fleets run at once (each the zero-cost fake replica and one
daphne, as `benchmarks.gateway --replica fake` starts them): side A, from another checkout
(`--a-repo`, with its interpreter `--a-python`) and/or with more environment (`--a-env
NAME=VALUE`), and side B, this checkout (`--b-env` likewise). They take turns in short bursts
of `--burst` non-streaming requests (`max_tokens` 1, `--concurrency` at a time; the order
alternates every round), and the API processes' CPU time (user + system) is added up per side
over `--rounds` rounds; the noise then falls on both sides alike. `--system-words N` puts a
long system prompt (one of 12) before each request. `--stream-tokens N`: each request of a
burst streams N tokens instead (SSE, as `benchmarks.gateway`'s streaming rounds), which weighs
the per-token path (`cpu_us_per_token` is printed as well). `--a-api-processes N` /
`--b-api-processes N`: that side's API as N daphne processes on its port (default 1);
`--a-api-python` / `--b-api-python`: that side's API processes alone on another interpreter (a
web environment of requirements/web.txt). Prints
each side's `cpu_ms_per_request` (all rounds), the median of the rounds' B/A ratios, and the
load average.
The benchmark tenants' request and token limits are lifted (bursts add up past the tier's).
Measurement only: the numbers of record come from `benchmarks.gateway`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
from pathlib import Path

import httpx

from benchmarks.fleet import LOGS, REPO, lift_tenant_limits, start_fleet
from benchmarks.gateway import (
    api_processes,
    cpu_seconds,
    percentile,
    timed_round,
    via_platform,
    via_platform_raw,
)
from benchmarks.raw_http import RawClient



async def with_system_prompt(http, fleet, index: int, words: int) -> None:
    """A short request (`max_tokens` 1) behind a system prompt of `words` words, one of 12
    (a long prompt: many prefix blocks for the router to match and record)."""
    system = " ".join(f"rule{(index % 12) * 7 + w % 97}" for w in range(words))
    body = {"model": "chat-small", "max_tokens": 1, "temperature": 0.0,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": f"Question {index}?"}]}
    reply = await http.post(fleet.base_url + "/v1/generate", json=body,
                            headers={"Authorization": f"Bearer {fleet.api_key}"})
    reply.raise_for_status()


def _env(pairs: list[str]) -> dict:
    return dict(pair.split("=", 1) for pair in pairs)


def start_side(name: str, repo: Path, python: str, env: dict, database: str,
               processes: int = 1, api_python: str | None = None):
    fleet = start_fleet("fake", database=database, repo=repo, python=python, extra_env=env,
                        logs=LOGS / f"ab-{name}", api_processes=processes,
                        api_python=api_python)
    lift_tenant_limits(fleet, repo=repo, python=python)
    return fleet


async def run(args) -> dict:
    sides = {}
    raws: dict[str, RawClient] = {}
    try:
        # As many admission slots as streams run at once (benchmarks.gateway's reason: the
        # rest would wait for slots, and the admission queue would be what TTFT measures).
        slots = {"ADMISSION_SLOTS_PER_REPLICA": str(args.ttft_streams)} if args.ttft_streams \
            else {}
        sides["A"] = start_side("a", Path(args.a_repo).resolve(), args.a_python,
                                {**slots, **_env(args.a_env)}, args.database + "_a",
                                args.a_api_processes, args.a_api_python)
        sides["B"] = start_side("b", REPO, sys.executable, {**slots, **_env(args.b_env)},
                                args.database + "_b", args.b_api_processes, args.b_api_python)
        cpu = {name: 0.0 for name in sides}
        ratios = []
        ttfts = {name: [] for name in sides}  # --ttft-streams: every stream's TTFT, per side
        round_p50s = {name: [] for name in sides}
        raws.update((name, RawClient(fleet.base_url,
                                     max_connections=2 * max(1, args.ttft_streams)))
                    for name, fleet in sides.items())
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=32)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http:
            sem = asyncio.Semaphore(args.concurrency)

            def short(fleet, name):
                async def one(i):
                    if args.ttft_streams:  # all at once, through the lean client
                        return await via_platform_raw(raws[name], fleet, i,
                                                      args.stream_tokens or 64)
                    async with sem:
                        if args.stream_tokens:
                            return await via_platform(http, fleet, i, args.stream_tokens)
                        if not args.system_words:
                            return await via_platform(http, fleet, i, 1, stream=False)
                        return await with_system_prompt(http, fleet, i, args.system_words)
                return one

            burst = args.ttft_streams or args.burst
            for name, fleet in sides.items():  # warm-up: tokenizer, channels, caches
                await timed_round(lambda i, f=fleet: via_platform(http, f, i, 8), 8)
                for _ in range(3 if args.ttft_streams else 1):  # every connection opened
                    await timed_round(short(fleet, name), burst)
            procs = {name: api_processes(fleet) for name, fleet in sides.items()}
            for round_ in range(args.rounds):
                order = ["A", "B"] if round_ % 2 == 0 else ["B", "A"]
                this = {}
                for name in order:
                    before = cpu_seconds(procs[name])
                    _, samples = await timed_round(short(sides[name], name), burst)
                    this[name] = cpu_seconds(procs[name]) - before
                    if args.ttft_streams:
                        values = [sample.ttft_s * 1000 for sample in samples]
                        ttfts[name] += values
                        round_p50s[name].append(percentile(values, 50))
                    cpu[name] += this[name]
                if this["A"] > 0:
                    ratios.append(this["B"] / this["A"])
    finally:
        for raw in raws.values():
            await raw.aclose()
        for fleet in sides.values():
            fleet.stop()
    requests = args.rounds * (args.ttft_streams or args.burst)
    if args.stream_tokens:
        for name in ("A", "B"):
            print(f"{name}: cpu_us_per_token "
                  f"{cpu[name] * 1e6 / (requests * args.stream_tokens):.1f}")
    result = {
        "a": {"repo": str(args.a_repo), "python": args.a_python, "env": _env(args.a_env),
              "api_python": args.a_api_python or args.a_python,
              "cpu_ms_per_request": round(cpu["A"] * 1000 / requests, 3),
              "api_processes": args.a_api_processes},
        "b": {"repo": str(REPO), "python": sys.executable, "env": _env(args.b_env),
              "api_python": args.b_api_python or sys.executable,
              "cpu_ms_per_request": round(cpu["B"] * 1000 / requests, 3),
              "api_processes": args.b_api_processes},
        "b_over_a": round(cpu["B"] / cpu["A"], 3) if cpu["A"] else None,
        "stream_tokens": args.stream_tokens,
        "b_over_a_median_of_rounds": round(statistics.median(ratios), 3) if ratios else None,
        "rounds": args.rounds, "burst": args.burst, "concurrency": args.concurrency,
        "system_words": args.system_words,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    if args.ttft_streams:
        result["ttft_streams"] = args.ttft_streams
        for name in ("A", "B"):
            result[name.lower()]["ttft_p50_ms"] = round(percentile(ttfts[name], 50), 2)
            result[name.lower()]["ttft_p90_ms"] = round(percentile(ttfts[name], 90), 2)
        result["b_minus_a_ttft_p50_ms_median_of_rounds"] = round(statistics.median(
            b - a for a, b in zip(round_p50s["A"], round_p50s["B"])), 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a-repo", default=str(REPO), help="side A's checkout (default: this)")
    parser.add_argument("--a-python", default=sys.executable, help="side A's interpreter")
    parser.add_argument("--a-env", nargs="*", default=[], metavar="NAME=VALUE")
    parser.add_argument("--a-api-python", default=None,
                        help="side A's API processes only on this interpreter (default: its "
                             "--a-python); the fake replica and manage.py stay on --a-python")
    parser.add_argument("--b-api-python", default=None,
                        help="side B's API processes only on this interpreter")
    parser.add_argument("--b-env", nargs="*", default=[], metavar="NAME=VALUE")
    parser.add_argument("--a-api-processes", type=int, default=1,
                        help="side A's daphne processes on its port (default 1)")
    parser.add_argument("--b-api-processes", type=int, default=1,
                        help="side B's daphne processes on its port (default 1)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--system-words", type=int, default=0,
                        help="a system prompt of this many words before each short request")
    parser.add_argument("--stream-tokens", type=int, default=0,
                        help="stream this many tokens per request (0: short non-streaming)")
    parser.add_argument("--ttft-streams", type=int, default=0,
                        help="each round: this many streams at once per side (of "
                             "--stream-tokens tokens, 64 if 0), through benchmarks.gateway's "
                             "lean client; prints each side's TTFT p50/p90 and the median of "
                             "the rounds' B-A difference of p50 (0: short requests)")
    parser.add_argument("--database", default="llm_platform_bench_ab",
                        help="prefix of the two sides' databases (_a, _b)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llm_platform.settings")
    os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(48))
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
