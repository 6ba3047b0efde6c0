"""End to end: `python -m replica.launch` runs a real tritonserver with our engine and SmolLM2.

One replica for the module (float32, so batched and solo greedy outputs agree bit for bit); the
SIGTERM test runs last and stops it.
"""
from __future__ import annotations

import asyncio
import glob
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

grpc_aio = pytest.importorskip("tritonclient.grpc.aio")
from tritonclient.grpc import InferInput  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402
from scripts.services import free_ports  # noqa: E402
from tests.support.waiting import async_wait_until  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2"
DRAIN_GRACE_S = 20.0
KV_CACHE_BYTES = 64 << 20  # fp32 SmolLM2: ~0.7 MiB per 16-token block -> ~90 blocks
TOPICS = ["the sea", "a cat", "winter", "coffee", "Paris", "robots", "a garden", "the moon",
          "music", "rain", "a library", "trains", "mountains", "bread", "a lighthouse", "friendship"]
PROMPTS = [f"Write one sentence about {topic}." for topic in TOPICS]
ALL_OUTPUTS = {"text_output", "finish_reason", "num_input_tokens", "num_output_tokens",
               "num_cached_tokens", "final"}
LEAN_OUTPUTS = {"text_output", "num_output_tokens", "final"}


@dataclass
class Replica:
    process: subprocess.Popen
    grpc_url: str
    metrics_url: str
    http_url: str
    server_pid: int
    lines: list[str] = field(default_factory=list)
    # Its metrics as it became ready, before any test sent it anything.
    fresh_metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Generation:
    text: str = ""
    finish_reason: str = ""
    num_output_tokens: int = 0
    num_responses: int = 0
    times: list[float] = field(default_factory=list)
    outputs: list[set[str]] = field(default_factory=list)  # each response's output names
    error: str | None = None


def _pump(stream, sink: queue.Queue) -> None:
    for line in stream:
        sink.put(line.rstrip("\n"))
    sink.put(None)


@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    grpc_port, http_port, metrics_port = free_ports(3)
    command = [
        sys.executable, "-m", "replica.launch", "--model", MODEL, "--dtype", "float32",
        "--kv-cache-bytes", str(KV_CACHE_BYTES), "--max-num-seqs", "32", "--max-num-batched-tokens", "256",
        "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--metrics-port", str(metrics_port),
        "--workdir", str(tmp_path_factory.mktemp("replica")), "--drain-grace-s", str(DRAIN_GRACE_S),
    ]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + 600
    while True:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            line = None
        if line is None or time.monotonic() > deadline:
            process.kill()
            pytest.fail("replica did not become ready:\n" + "\n".join(seen))
        seen.append(line)
        if line.startswith("replica ready:"):
            break
    server_pid = int(re.search(r"pid=(\d+)", seen[-1]).group(1))
    handle = Replica(process, f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{metrics_port}/metrics",
                     f"http://127.0.0.1:{http_port}", server_pid, seen)
    handle.fresh_metrics = scrape(handle.metrics_url)
    threading.Thread(target=lambda: [seen.append(x) for x in iter(lines.get, None)], daemon=True).start()
    yield handle
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=DRAIN_GRACE_S + 40)
        except subprocess.TimeoutExpired:
            process.kill()


def _inputs(text: str | None, max_tokens: int, *, raw_params: str | None = None,
            input_ids: list[int] | None = None, prepend_prompt: bool = False) -> list[InferInput]:
    inputs = []
    if text is not None:
        t = InferInput("text_input", [1], "BYTES")
        t.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
        inputs.append(t)
    if input_ids is not None:
        ids = InferInput("input_ids", [len(input_ids)], "INT64")
        ids.set_data_from_numpy(np.array(input_ids, dtype=np.int64))
        inputs.append(ids)
    if prepend_prompt:
        exclude = InferInput("exclude_input_in_output", [1], "BOOL")
        exclude.set_data_from_numpy(np.array([False]))
        inputs.append(exclude)
    params = raw_params if raw_params is not None else json.dumps(
        {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    )
    p = InferInput("sampling_parameters", [1], "BYTES")
    p.set_data_from_numpy(np.array([params.encode()], dtype=np.object_))
    inputs.append(p)
    return inputs


async def _one(inputs):
    yield {"model_name": MODEL, "inputs": inputs}


async def generate(client, text: str | None, max_tokens: int = 16, *, raw_params: str | None = None,
                   on_response=None, **inputs) -> Generation:
    """One request on its own gRPC stream; returns what came back (error instead of raising).

    Reads until the server ends the stream: cancelling right after the final response sometimes
    left Triton 2.51 unable to unload the model at shutdown (measured)."""
    result = Generation()
    try:
        async for response, error in client.stream_infer(_one(_inputs(text, max_tokens, raw_params=raw_params, **inputs))):
            if error is not None:
                result.error = str(error)
                continue
            result.num_responses += 1
            result.times.append(time.perf_counter())
            result.outputs.append({o.name for o in response.get_response().outputs})
            result.text += response.as_numpy("text_output")[0].decode()
            if on_response is not None:
                on_response(result)
            if response.as_numpy("final")[0]:
                result.finish_reason = response.as_numpy("finish_reason")[0].decode()
                result.num_output_tokens = int(response.as_numpy("num_output_tokens")[0])
    except InferenceServerException as exc:
        result.error = str(exc)
    except Exception as exc:  # grpc.aio errors during server shutdown
        result.error = repr(exc)
    return result


def scrape(metrics_url: str) -> dict[str, float]:
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^replica_(\w+)\{[^}]*\} (\S+)$", text, re.M)}


async def wait_for_metrics(metrics_url: str, predicate, what: str,
                           timeout_s: float = 30.0) -> dict[str, float]:
    """The replica's metrics once `predicate` holds on them (a named poll: fails naming `what`)."""
    async def values() -> dict[str, float] | None:
        scraped = await asyncio.to_thread(scrape, metrics_url)
        return scraped if predicate(scraped) else None

    return await async_wait_until(values, timeout_s, what, period_s=0.1)


def test_a_fresh_replica_reports_its_kv_pool_before_serving_anything(replica):
    # Read by the fixture as the replica became ready, whatever ran before this test: before
    # the fix its gauges stayed at 0 free of 0 blocks until the first request, and routing
    # read that as a full pool.
    metrics = replica.fresh_metrics
    assert metrics["running_seqs"] == 0 and metrics["waiting_seqs"] == 0
    assert metrics["kv_total_blocks"] > 0
    assert metrics["kv_free_blocks"] == metrics["kv_free_uncached_blocks"] == \
        metrics["kv_total_blocks"]


@pytest.mark.asyncio
async def test_concurrent_streams_interleave_and_match_solo(replica):
    client = grpc_aio.InferenceServerClient(replica.grpc_url)
    max_tokens = 16
    solo = [await generate(client, prompt, max_tokens) for prompt in PROMPTS]
    assert all(g.error is None and g.finish_reason == "length" for g in solo), solo

    peak = {"running": 0.0}
    stop = asyncio.Event()

    async def sample_running():
        while not stop.is_set():
            peak["running"] = max(peak["running"], (await asyncio.to_thread(scrape, replica.metrics_url))["running_seqs"])
            await asyncio.sleep(0.05)  # a sampler of the peak while the streams run, not a wait

    sampler = asyncio.create_task(sample_running())
    together = await asyncio.gather(*(generate(client, prompt, max_tokens) for prompt in PROMPTS))
    stop.set()
    await sampler
    await client.close()

    for alone, batched in zip(solo, together):
        assert batched.error is None
        assert (batched.text, batched.finish_reason, batched.num_output_tokens) == (alone.text, "length", max_tokens)
        assert batched.num_responses == max_tokens  # one response per token
        # The first and the last carry every output; the ones between what changes per token.
        assert batched.outputs[0] == batched.outputs[-1] == ALL_OUTPUTS
        assert all(names == LEAN_OUTPUTS for names in batched.outputs[1:-1]), batched.outputs
    # Continuous batching: every stream was still producing when the last one started producing.
    assert max(g.times[0] for g in together) < min(g.times[-1] for g in together)
    assert peak["running"] > 1


class _CountingChannels:
    """The platform client's channel protocol, counting the batches it reads."""

    def __init__(self, inner):
        self._inner, self.batches, self.submitted = inner, [], []

    def command(self, *args):
        return self._inner.command(*args)

    def is_ack(self, response):
        return self._inner.is_ack(response)

    def takes_batches(self, response):
        return self._inner.takes_batches(response)

    def entries(self, response):
        entries = self._inner.entries(response)
        self.batches.append(len(entries))
        return entries

    def batch(self, model_name, batch_id, submissions):
        self.submitted.append(len(submissions))
        return self._inner.batch(model_name, batch_id, submissions)


@pytest.mark.asyncio
async def test_the_platform_client_reads_the_tokens_of_concurrent_requests_in_batches(replica):
    """The platform's client opens a channel on its shared call (replica/backend/channel.py):
    the replica then sends each flush's outputs of every request on the call in one response.
    The tokens are the ones each request gets on its own responses."""
    from inference.replica_client import ReplicaRequest
    from inference.triton_client import TritonReplicaClient

    def request(name: str, prompt: str) -> ReplicaRequest:
        return ReplicaRequest(request_id=f"{name}-{time.monotonic_ns()}", model_name=MODEL,
                              prompt_text=prompt, prompt_token_ids=None, max_tokens=10,
                              temperature=0.0, top_p=1.0, seed=0, stop=(), priority=0,
                              tenant="t")

    async def collect(client, name, prompt):
        return [chunk async for chunk in client.stream(replica.grpc_url, request(name, prompt))]

    alone = TritonReplicaClient(first_token_timeout=120, token_timeout=60, channels=False)
    solo = [await collect(alone, "solo", prompt) for prompt in PROMPTS[:4]]
    await alone.close()
    client = TritonReplicaClient(first_token_timeout=120, token_timeout=60, calls_per_replica=1)
    await collect(client, "opener", PROMPTS[4])  # opens the call's channel meanwhile
    (call,) = client._pools[replica.grpc_url].calls
    assert call._channel_of[MODEL][1] == "open"
    call._channels = counting = _CountingChannels(call._channels)
    together = await asyncio.gather(*(collect(client, "ch", prompt) for prompt in PROMPTS[:4]))
    await client.close()
    for alone_chunks, chunks in zip(solo, together):
        assert "".join(c.text for c in chunks) == "".join(c.text for c in alone_chunks)
        assert [c.num_output_tokens for c in chunks] == list(range(1, len(chunks) + 1))
        assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
        final, alone_final = chunks[-1], alone_chunks[-1]
        assert (final.finish_reason, final.num_output_tokens, final.num_input_tokens) == (
            alone_final.finish_reason, alone_final.num_output_tokens, alone_final.num_input_tokens)
    assert sum(counting.batches) == sum(len(chunks) for chunks in together)
    assert max(counting.batches) > 1  # an engine step's tokens of several requests together
    # Submitted in one turn of the loop: the four went as one submission batch.
    assert counting.submitted == [4]


@pytest.mark.asyncio
async def test_a_submission_batch_fails_its_bad_requests_alone(replica):
    """Requests sent as one submission batch (replica/backend/submission_batch.py) get the
    checks a lone request gets; a bad one's error comes on the channel, classified as a lone
    request's error reply is, and its neighbours answer as they would alone."""
    from inference.replica_client import ReplicaRejected, ReplicaRequest
    from inference.triton_client import TritonReplicaClient

    def request(name: str, prompt: str, **changes) -> ReplicaRequest:
        fields = dict(request_id=f"{name}-{time.monotonic_ns()}", model_name=MODEL,
                      prompt_text=prompt, prompt_token_ids=None, max_tokens=6,
                      temperature=0.0, top_p=1.0, seed=0, stop=(), priority=0, tenant="t")
        return ReplicaRequest(**{**fields, **changes})

    async def collect(client, req):
        return [chunk async for chunk in client.stream(replica.grpc_url, req)]

    client = TritonReplicaClient(first_token_timeout=120, token_timeout=60, calls_per_replica=1)
    solo = await collect(client, request("solo", PROMPTS[0]))  # opens the call's channel
    (call,) = client._pools[replica.grpc_url].calls
    call._channels = counting = _CountingChannels(call._channels)
    results = await asyncio.gather(
        collect(client, request("fine", PROMPTS[0])),
        collect(client, request("top-p", PROMPTS[0], top_p=5.0)),  # refused at submission
        collect(client, request("ids", "", prompt_token_ids=(1, 10**9))),  # by the engine
        collect(client, request("fine-too", PROMPTS[0])),
        return_exceptions=True)
    after = await collect(client, request("after", PROMPTS[0]))
    await client.close()
    assert counting.submitted == [4]
    text = "".join(c.text for c in solo)
    for chunks in (results[0], results[3], after):
        assert not isinstance(chunks, BaseException), chunks
        assert "".join(c.text for c in chunks) == text and chunks[-1].final
    assert isinstance(results[1], ReplicaRejected) and "top_p" in str(results[1]), results[1]
    assert isinstance(results[2], ReplicaRejected), results[2]
    assert "prompt token ids must lie in" in str(results[2])


@pytest.mark.asyncio
async def test_cancelled_stream_frees_its_blocks(replica):
    client = grpc_aio.InferenceServerClient(replica.grpc_url)
    before = scrape(replica.metrics_url)
    stream = client.stream_infer(_one(_inputs(PROMPTS[0] * 8, 1000)))
    num_responses = 0
    async for response, error in stream:
        assert error is None
        num_responses += 1
        if num_responses == 3:
            break
    # The gauges are published by the replica's sender thread, which can lag a loaded machine:
    # wait (briefly) for them to show the live sequence before cancelling it.
    during = await wait_for_metrics(
        replica.metrics_url,
        lambda m: m["kv_free_blocks"] < m["kv_total_blocks"] or m["running_seqs"] >= 1,
        "the live sequence in the replica's gauges", timeout_s=10.0)
    stream.cancel()
    after = await wait_for_metrics(
        replica.metrics_url,
        lambda m: m["running_seqs"] == 0 and m["waiting_seqs"] == 0 and m["kv_free_blocks"] == m["kv_total_blocks"],
        "the cancelled sequence's blocks freed")
    await client.close()
    assert during["kv_free_blocks"] < during["kv_total_blocks"] or during["running_seqs"] >= 1
    assert after["running_seqs"] == 0 and after["waiting_seqs"] == 0
    assert after["kv_free_blocks"] == after["kv_total_blocks"]
    # Its prompt's full blocks stay in the prefix cache: free, but taking them would evict them.
    assert 0 <= after["kv_free_uncached_blocks"] < after["kv_free_blocks"]
    # The engine stopped generating for it long before max_tokens.
    assert after["generated_tokens_total"] - before["generated_tokens_total"] < 200


@pytest.mark.asyncio
async def test_invalid_requests_get_clear_errors_while_others_continue(replica):
    client = grpc_aio.InferenceServerClient(replica.grpc_url)
    valid = asyncio.create_task(generate(client, PROMPTS[1], 16))
    invalid = await asyncio.gather(
        generate(client, "hi", raw_params='{"max_tokens": 4, "top_p": 5}'),
        generate(client, "hi", raw_params="{not json"),
        generate(client, "hi", raw_params='{"max_tokens": 4, "beam_width": 3}'),
        generate(client, None, 4),  # no text_input
    )
    ok = await valid
    await client.close()
    for result, needle in zip(invalid, ["top_p", "not valid JSON", "unknown sampling parameters", "text_input is required"]):
        assert result.error is not None and "invalid request:" in result.error and needle in result.error, result
    assert ok.error is None and ok.finish_reason == "length" and ok.num_output_tokens == 16


@pytest.mark.asyncio
async def test_prompt_token_ids_get_the_engine_s_one_check(replica):
    """input_ids are checked once, by the engine (LLMEngine.check_prompt), before anything
    decodes them (a prompt echoed back is decoded first)."""
    client = grpc_aio.InferenceServerClient(replica.grpc_url)
    results = await asyncio.gather(
        generate(client, None, 4, input_ids=[]),
        generate(client, None, 4, input_ids=[1, 10**9]),
        generate(client, None, 4, input_ids=[-1], prepend_prompt=True),
    )
    fine = await generate(client, None, 4, input_ids=[1, 2, 3], prepend_prompt=True)
    await client.close()
    for result, needle in zip(results, ["the prompt is empty", "prompt token ids must lie in",
                                        "prompt token ids must lie in"]):
        assert result.error is not None and "invalid request:" in result.error and needle in result.error, result
    assert fine.error is None and fine.num_output_tokens == 4


@pytest.mark.asyncio
async def test_prompt_over_the_context_window_errors(replica):
    client = grpc_aio.InferenceServerClient(replica.grpc_url)
    too_long = await generate(client, "hello " * 9000, 4)
    fine = await generate(client, PROMPTS[2], 4)
    await client.close()
    assert too_long.error is not None and "invalid request:" in too_long.error and "context window" in too_long.error
    assert fine.error is None and fine.num_output_tokens == 4


@pytest.mark.asyncio
async def test_extreme_sampling_values_then_a_normal_request_on_the_same_replica(replica):
    """Values inside every documented range that once killed the engine (temperature 1e-45
    divided the logits into inf and the softmax into NaN): each request is answered and the
    replica goes on serving."""
    client = grpc_aio.InferenceServerClient(replica.grpc_url)
    extreme = [
        {"temperature": 1e-45}, {"temperature": 5e-324}, {"temperature": 1e-5, "seed": 1},
        {"temperature": 1.0, "top_p": 1e-45, "seed": 2}, {"top_k": 10**18, "temperature": 1.0, "seed": 3},
        {"temperature": 100.0, "top_k": 1 << 40, "top_p": 1e-45, "seed": 4},
        {"temperature": 0.7, "seed": (1 << 63) - 1}, {"temperature": 0.7, "seed": -(1 << 63)},
    ]
    out_of_range = [{"temperature": 0.7, "seed": (1 << 200) + 5}, {"temperature": 0.7, "seed": -(1 << 70)}]
    results = await asyncio.gather(*(
        generate(client, PROMPTS[7], raw_params=json.dumps({"max_tokens": 4, "ignore_eos": True, **params}))
        for params in extreme))
    refused = await asyncio.gather(*(
        generate(client, PROMPTS[7], raw_params=json.dumps({"max_tokens": 4, **params}))
        for params in out_of_range))
    greedy = await generate(client, PROMPTS[7], 4)
    normal = await generate(client, PROMPTS[8], 8)
    await client.close()
    for params, result in zip(extreme, results):
        assert result.error is None and result.num_output_tokens == 4, (params, result)
    for params, result in zip(out_of_range, refused):  # a clear refusal of that request alone
        assert result.error and result.error.startswith("invalid request: seed"), (params, result)
    assert results[0].text == results[1].text == greedy.text  # below the floor is greedy
    assert normal.error is None and normal.finish_reason == "length" and normal.num_output_tokens == 8
    assert scrape(replica.metrics_url)["engine_alive"] == 1.0


def test_non_streaming_http_generate_returns_the_whole_text_with_the_prompt(replica):
    """stream=false: one response, so Triton's plain HTTP /generate works; like the vLLM backend,
    the prompt is then included unless exclude_input_in_output is true."""
    def post(body: dict) -> dict:
        request = urllib.request.Request(f"{replica.http_url}/v2/models/{MODEL}/generate", data=json.dumps(body).encode())
        return json.loads(urllib.request.urlopen(request, timeout=120).read())

    params = json.dumps({"max_tokens": 6, "temperature": 0, "ignore_eos": True})
    whole = post({"text_input": PROMPTS[6], "stream": False, "sampling_parameters": params})
    bare = post({"text_input": PROMPTS[6], "stream": False, "exclude_input_in_output": True, "sampling_parameters": params})
    assert whole["final"] is True and whole["finish_reason"] == "length" and whole["num_output_tokens"] == 6
    assert bare["text_output"] and whole["text_output"] == PROMPTS[6] + bare["text_output"]


def test_metrics_port_says_what_the_engine_runs(replica):
    """The compute dtype `auto` resolved to and the quantization, as the platform reads them."""
    from inference.replica_signals import parse_info

    text = urllib.request.urlopen(replica.metrics_url, timeout=5).read().decode()
    info = parse_info(text)
    assert (info.get("dtype"), info.get("quantization")) == ("float32", "none"), text
    ready = next(line for line in replica.lines if line.startswith("replica ready:"))
    server_log = Path(re.search(r"\(log: (\S+)\)", ready).group(1)).read_text()
    assert "loaded: compute dtype float32 (asked float32), quantization none" in server_log


@pytest.mark.asyncio
async def test_request_id_in_the_log_and_vllm_metrics_move(replica):
    """Triton's request id names the request in the replica's log; vLLM's names are exported
    (routers of the field read them) and a request moves TTFT and inter-token histograms."""
    from prometheus_client.parser import text_string_to_metric_families

    def samples() -> dict:
        text = urllib.request.urlopen(replica.metrics_url, timeout=5).read().decode()
        return {(s.name, s.labels.get("le")): s.value for f in text_string_to_metric_families(text)
                for s in f.samples if s.name.startswith("vllm:")}

    before = samples()
    client = grpc_aio.InferenceServerClient(replica.grpc_url)

    async def one():
        yield {"model_name": MODEL, "inputs": _inputs(PROMPTS[0], 4), "request_id": "trace-e2e-1"}

    try:
        async for response, error in client.stream_infer(one()):
            assert error is None
            if response.as_numpy("final")[0]:
                break
    finally:
        await client.close()
    after = await asyncio.to_thread(samples)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
        assert (name, None) in after, name
    assert after[("vllm:time_to_first_token_seconds_count", None)] == before.get(
        ("vllm:time_to_first_token_seconds_count", None), 0) + 1
    assert after[("vllm:inter_token_latency_seconds_count", None)] >= before.get(
        ("vllm:inter_token_latency_seconds_count", None), 0) + 3
    ready = next(line for line in replica.lines if line.startswith("replica ready:"))
    server_log = Path(re.search(r"\(log: (\S+)\)", ready).group(1)).read_text()
    assert "request trace-e2e-1: " in server_log


def test_missing_weights_fails_at_launch_with_a_clear_message(tmp_path):
    grpc_port, http_port, metrics_port = free_ports(3)
    missing = tmp_path / "nope.gguf"
    result = subprocess.run(
        [sys.executable, "-m", "replica.launch", "--model", "m", "--weights", str(missing),
         "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--metrics-port", str(metrics_port)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0
    assert f"weights not found: {missing}" in result.stderr


@pytest.mark.asyncio
async def test_sigterm_drains_then_exits_cleanly(replica):
    """Runs last: in-flight streams finish (or are aborted at the grace deadline), new ones are
    refused, the launcher exits 0 and leaves no server process and no /dev/shm region behind."""
    client = grpc_aio.InferenceServerClient(replica.grpc_url)
    started = {"short": asyncio.Event(), "endless": asyncio.Event()}
    short = asyncio.create_task(generate(client, PROMPTS[3], 8, on_response=lambda g: started["short"].set()))
    endless = asyncio.create_task(generate(client, PROMPTS[4], 4000, on_response=lambda g: started["endless"].set()))
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started.values())), timeout=60)
    signalled = time.monotonic()
    replica.process.send_signal(signal.SIGTERM)
    # The model logs the drain once its engine loop has it: from then on new work is refused.
    server_log = Path(re.search(r"\(log: (.+)\)", next(
        line for line in replica.lines if line.startswith("replica ready:"))).group(1))

    async def drain_applied():
        text = await asyncio.to_thread(server_log.read_text, errors="replace")
        return "drain requested via" in text
    await async_wait_until(drain_applied, 60.0, "the model applying the drain", period_s=0.05)
    refused = await generate(grpc_aio.InferenceServerClient(replica.grpc_url), PROMPTS[5], 4)
    short_result, endless_result = await short, await endless
    await client.close()
    exit_code = await asyncio.to_thread(replica.process.wait, DRAIN_GRACE_S + 60)

    assert refused.error is not None, refused
    assert short_result.error is None and short_result.finish_reason == "length" and short_result.num_output_tokens == 8
    assert endless_result.finish_reason == "abort" or endless_result.error is not None
    assert endless_result.num_output_tokens < 4000
    assert time.monotonic() - signalled < DRAIN_GRACE_S + 30
    assert exit_code == 0, "\n".join(replica.lines)
    assert any(line.startswith("replica stopped") for line in replica.lines)
    assert not glob.glob(f"/dev/shm/replica{replica.process.pid}_*")
    with pytest.raises(ProcessLookupError):
        os.kill(replica.server_pid, 0)
