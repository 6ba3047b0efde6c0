"""python -m benchmarks.gateway [--out FILE.json]: what the platform costs on the request path.

One real SmolLM2 replica. In the same run, alternating rounds: N concurrent streams through the
platform (daphne -> router -> gRPC -> SSE) and N directly to the same replica with tritonclient
(the same prompts as token ids, the same sampling). Reports output tokens/s both ways and
`relay_efficiency` (platform / direct; target >= 0.9), the TTFT the platform adds
(`added_ttft_p50_ms`, target <= 10; `added_ttft_p99_ms`), and the requests/s of short
non-streaming requests the platform sustains (and the same directly, for scale). A second pass
(`platform_only`) repeats all of it against a zero-cost fake Triton replica (Triton's gRPC
protocol, no model), which isolates what the platform itself adds.

The platform side's client is `--client raw` (benchmarks/raw_http.py, a lean SSE reader) or
`httpx` (the client of rounds before "frontdoor9"). Each side's client shares the CPUs with
what it measures; `client_cpu_us_per_token` says what it took, per side (measured: raw 12-34
us per token, httpx 132-181, the direct side's gRPC client 68-171).

`cpu_ms_per_request` (short non-streaming requests) and `cpu_us_per_token` (the streaming
rounds) are the CPU time (user + system, psutil) of ALL the API processes during that phase
divided by the work; `--api-processes N` runs N daphne processes on one port
(llm_platform.web_processes). The load average and the CPU are recorded with the numbers: on a
shared machine they say how loaded the measurement was.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import time
from dataclasses import dataclass

import httpx
import psutil

from benchmarks.fleet import SMOLLM2, lift_tenant_limits, start_fleet, start_floor_front_door
from benchmarks.raw_http import RawClient
from inference.replica_client import ReplicaRequest
from inference.tokenization import load_weights_tokenizer
from inference.triton_client import TritonReplicaClient

# The fake pass's TTFT percentiles over 2 rounds (64 samples per side) moved by 2x between runs
# minutes apart here (added p50 12-45 ms, round frontdoor10); 6 rounds cost seconds more.
ROUNDS = {"smollm2": 2, "fake": 6}

SUBJECTS = ["a lighthouse", "a fox", "the moon", "a robot", "a river", "an old clock",
            "a violin", "a desert", "a comet", "a library", "a garden", "a train"]


@dataclass(frozen=True)
class Sample:
    ttft_s: float
    total_s: float
    output_tokens: int


def messages(index: int) -> list[dict]:
    return [{"role": "user", "content": f"Write a short story about {SUBJECTS[index % 12]}."}]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def generate_call(fleet, index: int, max_tokens: int, stream: bool) -> tuple[dict, dict]:
    """The body and headers of the benchmark's `/v1/generate` request number `index`."""
    body = {"model": "chat-small", "messages": messages(index), "max_tokens": max_tokens,
            "temperature": 0.0, "stream": stream}
    return body, {"Authorization": f"Bearer {fleet.api_key}"}


async def via_platform(client: httpx.AsyncClient, fleet, index: int, max_tokens: int,
                       stream: bool = True) -> Sample:
    body, headers = generate_call(fleet, index, max_tokens, stream)
    start = time.perf_counter()
    if not stream:
        reply = (await client.post(fleet.base_url + "/v1/generate", json=body, headers=headers))
        reply.raise_for_status()
        elapsed = time.perf_counter() - start
        return Sample(elapsed, elapsed, reply.json()["usage"]["output_tokens"])
    ttft, output_tokens, event = None, 0, None
    async with client.stream("POST", fleet.base_url + "/v1/generate", json=body,
                             headers=headers) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "token" and ttft is None:
                ttft = time.perf_counter() - start
            elif line.startswith("data: ") and event == "done":
                output_tokens = json.loads(line[6:])["usage"]["output_tokens"]
            elif line.startswith("data: ") and event == "error":
                raise RuntimeError(line)
    return Sample(ttft or 0.0, time.perf_counter() - start, output_tokens)


async def via_platform_raw(client: RawClient, fleet, index: int, max_tokens: int,
                           stream: bool = True) -> Sample:
    """`via_platform` through the lean client (benchmarks/raw_http.py)."""
    body, headers = generate_call(fleet, index, max_tokens, stream)
    start = time.perf_counter()
    if not stream:
        reply = await client.post("/v1/generate", body, headers)
        elapsed = time.perf_counter() - start
        return Sample(elapsed, elapsed, json.loads(reply)["usage"]["output_tokens"])
    seen = {"ttft": None, "output_tokens": 0}

    def on_event(name: bytes, data: bytes) -> None:
        if name == b"token":
            if seen["ttft"] is None:
                seen["ttft"] = time.perf_counter() - start
        elif name == b"done":
            seen["output_tokens"] = json.loads(data)["usage"]["output_tokens"]
        elif name == b"error":
            raise RuntimeError(data.decode())

    await client.post("/v1/generate", body, headers, on_event)
    return Sample(seen["ttft"] or 0.0, time.perf_counter() - start, seen["output_tokens"])


def platform_caller(client: str, raw: RawClient, http: httpx.AsyncClient, fleet):
    """`call(index, max_tokens, stream=True)` through the platform with the client `--client`
    names: `raw` (benchmarks/raw_http.py, the lean reader) or `httpx`."""
    if client == "raw":
        return lambda i, n, stream=True: via_platform_raw(raw, fleet, i, n, stream)
    return lambda i, n, stream=True: via_platform(http, fleet, i, n, stream)


async def direct(client: TritonReplicaClient, fleet, prompts, index: int, max_tokens: int) -> Sample:
    text, ids = prompts[index % len(prompts)]
    request = ReplicaRequest(request_id=f"bench-{index}-{time.monotonic_ns()}",
                             model_name="chat-small", prompt_text=text, prompt_token_ids=ids,
                             max_tokens=max_tokens, temperature=0.0, top_p=1.0, seed=None,
                             stop=(), priority=0, tenant="bench")
    start = time.perf_counter()
    ttft, output_tokens = None, 0
    async for chunk in client.stream(fleet.grpc_address, request):
        if ttft is None:
            ttft = time.perf_counter() - start
        if chunk.final:
            output_tokens = chunk.num_output_tokens
    return Sample(ttft or 0.0, time.perf_counter() - start, output_tokens)


def api_processes(fleet) -> list[psutil.Process]:
    parent = psutil.Process(fleet.api.pid)
    return [parent, *parent.children(recursive=True)]


def cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


async def timed_round(make, num: int) -> tuple[float, list[Sample]]:
    start = time.perf_counter()
    samples = await asyncio.gather(*(make(i) for i in range(num)))
    return time.perf_counter() - start, list(samples)


async def run(args, replica: str) -> dict:
    # Admission lets as many requests run per replica as the replica takes: the direct side
    # sends all its streams to the replica at once, and the fake replica (like the engine, up
    # to its max_num_seqs of 128) takes them all. At the platform's default of 16 slots the
    # rest of 32 streams waited for slots, which put the admission queue into the TTFT the
    # platform "adds" (bimodal: ~60 ms, then ~300 ms, measured in "frontdoor9").
    slots = max(args.streams, args.short_concurrency)
    rounds = args.rounds or ROUNDS[replica]
    fleet = start_fleet(replica, database=args.database, api_processes=args.api_processes,
                        api_python=args.api_python,
                        extra_env={"ADMISSION_SLOTS_PER_REPLICA": str(slots)})
    try:
        lift_tenant_limits(fleet)
        tokenizer = load_weights_tokenizer(SMOLLM2)
        prompts = [(tokenizer.apply_chat_template(messages(i)), tuple(tokenizer.encode_chat(messages(i))))
                   for i in range(len(SUBJECTS))]
        limits = httpx.Limits(max_connections=args.streams * 2, max_keepalive_connections=args.streams)
        async with httpx.AsyncClient(timeout=600, limits=limits) as http:
            raw = RawClient(fleet.base_url, max_connections=args.streams * 2)
            # The direct side reads as a Triton client does, one response per token and
            # request (on 16 shared calls); `--direct-channels`: batched on channels over one
            # call, as the platform reads by default (TRITON_CALLS_PER_REPLICA).
            triton = TritonReplicaClient(first_token_timeout=600, token_timeout=600,
                                         channels=args.direct_channels,
                                         calls_per_replica=1 if args.direct_channels else 16)
            plat_call = platform_caller(args.client, raw, http, fleet)
            plat = lambda i, n=args.max_tokens: plat_call(i, n)  # noqa: E731
            dire = lambda i, n=args.max_tokens: direct(triton, fleet, prompts, i, n)  # noqa: E731
            sides = [("direct", dire), ("platform", plat)]
            if args.floor:  # the featureless front door, side by side (benchmarks/floor_...)
                floor = RawClient(start_floor_front_door(fleet),
                                  max_connections=args.streams * 2)
                sides.append(
                    ("floor", lambda i, n=args.max_tokens: via_platform_raw(floor, fleet, i, n)))
            for _, make in sides:  # warm-up: tokenizer, channels, caches
                await timed_round(lambda i: make(i, 8), 4)
            api = api_processes(fleet)
            me = [psutil.Process()]
            stream_cpu_s = 0.0
            client_cpu_s = {name: 0.0 for name, _ in sides}
            totals = {name: [0.0, 0, []] for name, _ in sides}
            for _ in range(rounds):
                for name, make in sides:
                    cpu_before, client_before = cpu_seconds(api), cpu_seconds(me)
                    wall, samples = await timed_round(make, args.streams)
                    client_cpu_s[name] += cpu_seconds(me) - client_before
                    if name == "platform":
                        stream_cpu_s += cpu_seconds(api) - cpu_before
                    totals[name][0] += wall
                    totals[name][1] += sum(s.output_tokens for s in samples)
                    totals[name][2] += [s.ttft_s for s in samples]
            short = args.short_requests
            sem = asyncio.Semaphore(args.short_concurrency)

            async def bounded(coro_factory, i):
                async with sem:
                    return await coro_factory(i)

            cpu_before = cpu_seconds(api)
            short_plat, _ = await timed_round(
                lambda i: bounded(lambda j: plat_call(j, 1, stream=False), i), short)
            short_cpu_s = cpu_seconds(api) - cpu_before
            short_direct, _ = await timed_round(lambda i: bounded(lambda j: dire(j, 1), i), short)
            await triton.close()
            await raw.aclose()
            if args.floor:
                await floor.aclose()
    finally:
        fleet.stop()
    tps = {name: tokens / wall for name, (wall, tokens, _) in totals.items()}
    ttft = {name: values for name, (_, _, values) in totals.items()}
    floor = {} if not args.floor else {
        "floor_tokens_per_s": round(tps["floor"], 2),
        "floor_ttft_p50_ms": round(percentile(ttft["floor"], 50) * 1000, 2),
        "floor_added_ttft_p50_ms": round((percentile(ttft["floor"], 50)
                                          - percentile(ttft["direct"], 50)) * 1000, 2),
        "floor_added_ttft_p99_ms": round((percentile(ttft["floor"], 99)
                                          - percentile(ttft["direct"], 99)) * 1000, 2),
    }
    return {
        "replica": replica,
        "streams": args.streams,
        "rounds": rounds,
        "max_tokens": args.max_tokens,
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "api_processes": args.api_processes,
        "client": args.client,
        "admission_slots_per_replica": slots,
        "direct_channels": args.direct_channels,
        "platform_tokens_per_s": round(tps["platform"], 2),
        "direct_tokens_per_s": round(tps["direct"], 2),
        "relay_efficiency": round(tps["platform"] / tps["direct"], 4),
        "platform_ttft_p50_ms": round(percentile(ttft["platform"], 50) * 1000, 2),
        "direct_ttft_p50_ms": round(percentile(ttft["direct"], 50) * 1000, 2),
        "added_ttft_p50_ms": round((percentile(ttft["platform"], 50)
                                    - percentile(ttft["direct"], 50)) * 1000, 2),
        "added_ttft_p99_ms": round((percentile(ttft["platform"], 99)
                                    - percentile(ttft["direct"], 99)) * 1000, 2),
        **floor,
        "nonstream_short_requests": short,
        "nonstream_requests_per_s": round(short / short_plat, 2),
        "direct_short_requests_per_s": round(short / short_direct, 2),
        "cpu_ms_per_request": round(short_cpu_s * 1000 / short, 3),
        "cpu_us_per_token": round(stream_cpu_s * 1e6 / max(1, totals["platform"][1]), 1),
        # The benchmark's own CPU per token it read, each side (its client shares the CPUs).
        "client_cpu_us_per_token": {
            name: round(client_cpu_s[name] * 1e6 / max(1, totals[name][1]), 1)
            for name in client_cpu_s},
        "targets": {"relay_efficiency": ">= 0.9", "added_ttft_p50_ms": "<= 10",
                    "nonstream_requests_per_s": ">= 400", "cpu_ms_per_request": "<= 1.5"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=None,
                        help="streaming rounds per side (default: 2 against the real replica, "
                             "6 against the fake)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--short-requests", type=int, default=128)
    parser.add_argument("--short-concurrency", type=int, default=16)
    parser.add_argument("--replica", choices=["both", "smollm2", "fake"], default="both",
                        help="both (default): the real replica, then the zero-cost fake")
    parser.add_argument("--api-processes", type=int, default=1,
                        help="daphne processes sharing the API's port (default 1)")
    parser.add_argument("--database", default="llm_platform_bench",
                        help="the benchmark's own PostgreSQL database (one per concurrent run)")
    parser.add_argument("--api-python", default=None,
                        help="the API processes' interpreter (default: this one), e.g. a web "
                             "environment of requirements/web.txt on a newer CPython")
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw",
                        help="the platform side's HTTP client: raw (benchmarks/raw_http.py, as "
                             "lean as the direct side's gRPC client) or httpx (what rounds "
                             "before frontdoor9 used)")
    parser.add_argument("--direct-channels", action="store_true",
                        help="the direct side reads on channels too (replica/backend/channel.py)")
    parser.add_argument("--floor", action="store_true",
                        help="a third side in the same rounds: benchmarks/floor_front_door.py, "
                             "the least a Python front door does (no quota, admission, routing, "
                             "usage or metrics): floor_ttft_p50_ms and floor_added_ttft_p50_ms")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run (seconds) that only proves the benchmark still works")
    args = parser.parse_args()
    if args.smoke:  # the zero-cost fake replica only, a handful of requests
        args.replica, args.streams, args.rounds, args.max_tokens = "fake", 2, 1, 4
        args.short_requests, args.short_concurrency = 4, 2
        args.floor = True
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llm_platform.settings")
    os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(48))  # DEBUG is off: one per run
    # The real replica is the headline; on a small CPU its own queueing (seconds of TTFT) hides
    # milliseconds of platform cost, so a second pass against a zero-cost replica isolates it.
    result = {}
    if args.replica in {"both", "smollm2"}:
        result = asyncio.run(run(args, "smollm2"))
    if args.replica in {"both", "fake"}:
        result["platform_only"] = asyncio.run(run(args, "fake"))
    for key, value in result.items():
        if isinstance(value, dict) and key == "platform_only":
            for sub, subvalue in value.items():
                print(f"platform_only.{sub:19s} {subvalue}")
        else:
            print(f"{key:32s} {value}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
