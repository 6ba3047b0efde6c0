"""The Triton client over real gRPC (tritonclient.grpc.aio) against the fake replica."""
import asyncio
from contextlib import aclosing

import pytest

from inference.replica_client import (
    ReplicaDead,
    ReplicaRejected,
    ReplicaRequestFailed,
    ReplicaRequest,
    ReplicaStreamError,
    ReplicaUnavailable,
)
from inference.triton_client import TritonReplicaClient
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.asyncio


def request(text: str = "hello", max_tokens: int = 3, ids=(1, 2, 3)) -> ReplicaRequest:
    return ReplicaRequest(request_id="r1", model_name="chat-small", prompt_text=text,
                          prompt_token_ids=ids, max_tokens=max_tokens, temperature=0.0,
                          top_p=1.0, seed=None, stop=(), priority=10, tenant="7")


async def collect(client, address, req):
    return [chunk async for chunk in client.stream(address, req)]


async def test_streams_chunks_with_a_final_marker(fake_replica):
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10)
    chunks = await collect(client, fake_replica.grpc_address, request())
    await client.close()
    assert [c.text for c in chunks] == [" t0", " t1", " t2"]
    assert [c.final for c in chunks] == [False, False, True]
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].num_input_tokens == 3 and chunks[-1].num_output_tokens == 3
    sent = fake_replica.state.requests[0]
    assert sent["tenant"] == "7" and sent["priority"] == 10
    assert list(sent["input_ids"]) == [1, 2, 3]


async def test_invalid_request_is_rejected(fake_replica):
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10)
    with pytest.raises(ReplicaRejected, match="refuses"):
        await collect(client, fake_replica.grpc_address, request("[invalid]"))
    with pytest.raises(ReplicaStreamError):
        await collect(client, fake_replica.grpc_address, request("[fail]"))
    await client.close()


async def test_unreachable_replica_is_unavailable():
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10)
    with pytest.raises(ReplicaUnavailable):
        await collect(client, "127.0.0.1:1", request())
    await client.close()


async def test_closing_the_stream_cancels_on_the_replica(fake_replica):
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10)
    async with aclosing(client.stream(fake_replica.grpc_address,
                                      request("[slow]", max_tokens=1000))) as chunks:
        async for _ in chunks:
            assert fake_replica.state.num_running == 1
            break
    await async_wait_until(lambda: fake_replica.state.num_running == 0, 5.0,
                           "the replica cancelling the closed stream")
    assert fake_replica.state.num_running == 0
    await client.close()


async def test_a_silent_replica_times_out(fake_replica):
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=0.01)
    with pytest.raises(ReplicaUnavailable, match="no response"):
        await collect(client, fake_replica.grpc_address, request("[slow]", max_tokens=50))
    await client.close()


async def test_a_replica_silent_before_the_first_token_times_out(fake_replica):
    client = TritonReplicaClient(first_token_timeout=0.2, token_timeout=10)
    with pytest.raises(ReplicaUnavailable, match="no response from the replica for 0.2 s"):
        await collect(client, fake_replica.grpc_address, request("[slow-prefill]"))
    await client.close()


async def test_time_the_consumer_takes_between_tokens_is_not_silence(fake_replica):
    """Only the waits for the replica count: a consumer slower than `token_timeout` between
    tokens (tokens queue up meanwhile) reads them all, also across tasks (the relay reads the
    first chunk in the request's task and the rest in its pump's)."""
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=0.05)
    chunks = client.stream(fake_replica.grpc_address, request(max_tokens=4))
    texts = [(await anext(chunks)).text]

    async def rest():
        async for chunk in chunks:
            texts.append(chunk.text)
            await asyncio.sleep(0.15)  # the consumer's own pace: three token timeouts
    await asyncio.create_task(rest())
    assert texts == [" t0", " t1", " t2", " t3"]
    await client.close()


async def test_a_cancelled_reader_is_cancelled_not_timed_out(fake_replica):
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10)
    reader = asyncio.create_task(collect(client, fake_replica.grpc_address,
                                         request("[slow]", max_tokens=1000)))
    await asyncio.wait_for(fake_replica.state.arrived.wait(), 10)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    await async_wait_until(lambda: fake_replica.state.num_running == 0, 5.0,
                           "the replica cancelling the abandoned stream")
    await client.close()


async def test_engine_and_request_faults_are_told_apart(fake_replica):
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10)
    with pytest.raises(ReplicaRequestFailed, match="non-finite"):
        await collect(client, fake_replica.grpc_address, request("[request-failed]"))
    with pytest.raises(ReplicaDead) as in_flight:
        await collect(client, fake_replica.grpc_address, request("[kill-engine]"))
    assert in_flight.value.in_flight and "fake kernel fault" in str(in_flight.value)
    with pytest.raises(ReplicaDead) as refused:
        await collect(client, fake_replica.grpc_address, request())
    assert not refused.value.in_flight
    await client.close()


def tagged(request_id: str, text: str = "hello", max_tokens: int = 3) -> ReplicaRequest:
    return ReplicaRequest(request_id=request_id, model_name="chat-small", prompt_text=text,
                          prompt_token_ids=(1, 2, 3), max_tokens=max_tokens, temperature=0.0,
                          top_p=1.0, seed=None, stop=(), priority=0, tenant="7")


async def test_concurrent_requests_share_a_few_long_lived_calls(fake_replica):
    """Requests go over the pool's calls, each request's responses to itself (by id), and the
    calls stay open for the next requests."""
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10, calls_per_replica=4)
    address = fake_replica.grpc_address
    for _ in range(3):
        results = await asyncio.gather(*(collect(client, address, tagged(f"r{i}", max_tokens=i + 1))
                                         for i in range(12)))
        for i, chunks in enumerate(results):
            assert [c.text for c in chunks] == [f" t{k}" for k in range(i + 1)]
            assert [c.final for c in chunks] == [False] * i + [True]
            assert chunks[-1].num_output_tokens == i + 1
    assert fake_replica.state.num_requests == 36
    assert 1 <= fake_replica.state.calls_total <= 4
    assert fake_replica.state.calls_open == fake_replica.state.calls_total
    await client.close()


async def test_one_request_s_failure_leaves_the_others_on_its_call(fake_replica):
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10, calls_per_replica=1)
    address = fake_replica.grpc_address
    slow = asyncio.create_task(collect(client, address, tagged("slow", "[slow]", max_tokens=8)))
    await asyncio.wait_for(fake_replica.state.arrived.wait(), 10)
    with pytest.raises(ReplicaRejected, match="refuses"):
        await collect(client, address, tagged("bad", "[invalid]"))
    with pytest.raises(ReplicaRequestFailed, match="non-finite"):
        await collect(client, address, tagged("failed", "[request-failed]"))
    assert [c.text for c in await slow] == [f" t{k}" for k in range(8)]
    assert fake_replica.state.calls_total == 1
    await client.close()


async def test_an_abandoned_request_is_aborted_alone(fake_replica):
    """Closing one request's stream aborts it on the replica (the control request, on the
    shared call); the other request on that call streams on to its end."""
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10, calls_per_replica=1)
    address = fake_replica.grpc_address
    neighbour = asyncio.create_task(collect(client, address, tagged("next", "[slow]", max_tokens=6)))
    async with aclosing(client.stream(address, tagged("gone", "[slow]", max_tokens=1000))) as chunks:
        async for _ in chunks:
            break
    await async_wait_until(lambda: fake_replica.state.usage["gone"]["state"] == "finished", 5.0,
                           "the replica aborting the abandoned request")
    assert fake_replica.state.usage["gone"]["output_tokens"] < 1000
    assert len(await neighbour) == 6
    assert fake_replica.state.calls_total == 1
    await client.close()


async def test_a_lost_replica_fails_every_request_on_the_call_then_a_new_call_serves(fake_replica):
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10, calls_per_replica=1)
    address = fake_replica.grpc_address
    assert len(await collect(client, address, tagged("before"))) == 3
    streams = [asyncio.create_task(collect(client, address, tagged(f"s{i}", "[slow]", 1000)))
               for i in range(3)]
    await async_wait_until(lambda: fake_replica.state.num_running == 3, 5.0, "three streams running")
    await fake_replica.server.stop(grace=None)
    for stream in streams:
        with pytest.raises(ReplicaUnavailable):
            await stream
    with pytest.raises(ReplicaUnavailable):
        await collect(client, address, tagged("after"))
    await client.close()


async def test_usage_queries_go_over_the_shared_calls(fake_replica):
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10, calls_per_replica=2)
    address = fake_replica.grpc_address
    await collect(client, address, tagged("done", max_tokens=2))
    usage = await client.usage(address, "chat-small", ["done", "never"])
    assert usage["done"].state == "finished" and usage["done"].output_tokens == 2
    assert usage["never"].state == "unknown"
    assert fake_replica.state.calls_total <= 2
    await client.close()


async def test_idle_calls_are_closed(fake_replica):
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10, calls_per_replica=2,
                                 call_idle_s=0.2)
    await collect(client, fake_replica.grpc_address, tagged("one"))
    assert fake_replica.state.calls_open == 1
    await async_wait_until(lambda: fake_replica.state.calls_open == 0, 5.0,
                           "the idle call closed by the client")
    assert len(await collect(client, fake_replica.grpc_address, tagged("two"))) == 3
    assert fake_replica.state.calls_total == 2
    await client.close()


async def test_a_call_per_request_when_sharing_is_off(fake_replica):
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10, calls_per_replica=0)
    address = fake_replica.grpc_address
    await asyncio.gather(*(collect(client, address, tagged(f"r{i}")) for i in range(5)))
    assert fake_replica.state.calls_total == 5
    usage = await client.usage(address, "chat-small", ["r0"])
    assert usage["r0"].state == "finished" and usage["r0"].output_tokens == 3
    assert fake_replica.state.calls_total == 6  # the query had a call of its own too
    await client.close()
