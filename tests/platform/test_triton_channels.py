"""Channels (replica/backend/channel.py, inference/triton_calls.py): the tokens of the requests
on a shared call come back batched on one open request, against the fake replica over real
gRPC."""
import asyncio
from contextlib import aclosing

import pytest

from inference.replica_client import ReplicaRejected, ReplicaStreamError
from inference.triton_client import TritonReplicaClient
from tests.platform.test_triton_client import collect, tagged
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.asyncio


async def _open_channel(client, address) -> None:
    """A first request opens the call's channel; it streams on its own responses meanwhile."""
    assert [c.text for c in await collect(client, address, tagged("opener"))] == [
        " t0", " t1", " t2"]


async def test_concurrent_streams_come_back_in_shared_batches(fake_replica):
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10, calls_per_replica=1)
    address = fake_replica.grpc_address
    await _open_channel(client, address)
    assert fake_replica.state.channels_open == 1
    results = await asyncio.gather(*(collect(client, address, tagged(f"r{i}", max_tokens=16))
                                     for i in range(8)))
    for chunks in results:
        assert [c.text for c in chunks] == [f" t{k}" for k in range(16)]
        assert [c.num_output_tokens for c in chunks] == list(range(1, 17))
        assert [c.final for c in chunks] == [False] * 15 + [True]
        assert chunks[-1].finish_reason == "length" and chunks[-1].num_input_tokens == 3
    state = fake_replica.state
    assert state.channel_entries == 8 * 16
    assert state.channel_batches < state.channel_entries  # requests shared batches
    # Submitted in one turn of the loop: one message for the eight, not a write each.
    assert state.batches_received == 1 and state.num_requests == 9
    await client.close()


async def test_a_batched_request_carries_what_a_lone_one_does(fake_replica):
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10, calls_per_replica=1)
    address = fake_replica.grpc_address
    await _open_channel(client, address)
    await collect(client, address, tagged("alone", "same prompt", 4))  # a batch of one
    await asyncio.gather(*(collect(client, address, tagged(f"b{i}", "same prompt", 4))
                           for i in range(3)))
    assert fake_replica.state.batches_received == 1
    sent = {r["request_id"]: r for r in fake_replica.state.requests}
    for rid in ("b0", "b1", "b2"):
        batched, alone = dict(sent[rid]), dict(sent["alone"])
        assert list(batched.pop("input_ids")) == list(alone.pop("input_ids")) == [1, 2, 3]
        assert {**batched, "request_id": "alone"} == alone
    await client.close()


async def test_a_replica_without_batches_gets_a_message_per_request(fake_replica):
    fake_replica.state.batches = False  # channels, but from before submission batches
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10, calls_per_replica=1)
    address = fake_replica.grpc_address
    await _open_channel(client, address)
    results = await asyncio.gather(*(collect(client, address, tagged(f"r{i}", max_tokens=4))
                                     for i in range(6)))
    assert all([c.text for c in chunks] == [f" t{k}" for k in range(4)] for chunks in results)
    assert fake_replica.state.batches_received == 0 and fake_replica.state.num_requests == 7
    assert fake_replica.state.channel_entries == 6 * 4  # on the channel all the same
    await client.close()


async def test_a_batched_requests_error_fails_it_alone(fake_replica):
    """A request of a batch has no response of its own: its error is an entry on the
    channel, classified as a lone request's error reply is; its neighbours go on."""
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10, calls_per_replica=1)
    address = fake_replica.grpc_address
    await _open_channel(client, address)
    texts = ["fine", "[invalid]", "fine", "[request-failed]"]
    results = await asyncio.gather(*(collect(client, address, tagged(f"r{i}", text, 5))
                                     for i, text in enumerate(texts)), return_exceptions=True)
    assert fake_replica.state.batches_received == 1
    assert [c.text for c in results[0]] == [c.text for c in results[2]] == [
        f" t{k}" for k in range(5)]
    assert isinstance(results[1], ReplicaRejected) and "refuses this prompt" in str(results[1])
    assert type(results[3]).__name__ == "ReplicaRequestFailed"
    assert "non-finite" in str(results[3])
    await client.close()


async def test_a_batch_refused_as_a_whole_fails_each_of_its_requests(fake_replica):
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10, calls_per_replica=1)
    address = fake_replica.grpc_address
    await _open_channel(client, address)
    fake_replica.state.refuse_batches = True
    results = await asyncio.gather(*(collect(client, address, tagged(f"r{i}")) for i in range(3)),
                                   return_exceptions=True)
    assert all(isinstance(r, ReplicaRejected) and "refuses batches" in str(r) for r in results)
    fake_replica.state.refuse_batches = False
    # The call goes on: the next requests are served on it.
    results = await asyncio.gather(*(collect(client, address, tagged(f"s{i}")) for i in range(3)))
    assert all([c.text for c in chunks] == [" t0", " t1", " t2"] for chunks in results)
    assert fake_replica.state.calls_total == 1
    await client.close()


async def test_a_replica_without_channels_streams_every_request_on_its_own(fake_replica):
    fake_replica.state.channels = False
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10, calls_per_replica=1)
    address = fake_replica.grpc_address
    await collect(client, address, tagged("opener"))
    results = await asyncio.gather(*(collect(client, address, tagged(f"r{i}", max_tokens=5))
                                     for i in range(4)))
    assert all([c.text for c in chunks] == [f" t{k}" for k in range(5)] for chunks in results)
    assert fake_replica.state.channel_batches == 0 and fake_replica.state.num_requests == 5
    await client.close()


async def test_an_idle_call_closes_its_channel_before_it_ends(fake_replica):
    """The replica's channel request would keep the call open (and a draining replica
    loaded): the client closes it, then half-closes the call."""
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10, calls_per_replica=1,
                                 call_idle_s=0.2)
    await _open_channel(client, fake_replica.grpc_address)
    assert fake_replica.state.channels_open == 1
    await async_wait_until(lambda: fake_replica.state.calls_open == 0, 5.0,
                           "the idle call closed by the client")
    assert fake_replica.state.channels_open == 0
    await client.close()


async def test_a_failure_mid_stream_comes_after_the_tokens_before_it(fake_replica):
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10, calls_per_replica=1)
    address = fake_replica.grpc_address
    await _open_channel(client, address)
    seen = []
    with pytest.raises(ReplicaStreamError, match="mid-stream"):
        async for chunk in client.stream(address, tagged("dies", "[die-after-2]", 8)):
            seen.append(chunk.text)
    assert seen == [" t0", " t1"]
    await client.close()


async def test_an_abandoned_request_on_a_channel_is_aborted_alone(fake_replica):
    client = TritonReplicaClient(first_token_timeout=10, token_timeout=10, calls_per_replica=1)
    address = fake_replica.grpc_address
    await _open_channel(client, address)
    neighbour = asyncio.create_task(collect(client, address, tagged("next", "[slow]", 6)))
    async with aclosing(client.stream(address, tagged("gone", "[slow]", 1000))) as chunks:
        async for _ in chunks:
            break
    await async_wait_until(lambda: fake_replica.state.usage["gone"]["state"] == "finished", 5.0,
                           "the replica aborting the abandoned request")
    assert [c.text for c in await neighbour] == [f" t{k}" for k in range(6)]
    assert fake_replica.state.channel_entries >= 6
    await client.close()


async def test_the_fakes_channel_batches_gather_while_its_writer_is_busy():
    """The fake's entries wait in one pending batch per channel until its call's writer
    reaches it (as the replica's wait for its sender thread), not one queued batch per turn:
    a request started into a busy call gets its first token in the next batch written."""
    from tests.fakes.triton_server import FakeState, _Batch, _Call

    queue: asyncio.Queue = asyncio.Queue()
    state = FakeState()
    call = _Call(state, queue)
    call.channels["ch"] = ("chat-small", [])
    for index in range(3):
        call.add("ch", (f"r{index}", " t0", "", 3, 1, 0, False))
        await asyncio.sleep(0)  # turns of the loop pass while the writer is busy
    assert queue.qsize() == 1  # one place in the queue for the channel
    first = call.take(queue.get_nowait())
    assert state.channel_batches == 1 and state.channel_entries == 3
    assert first.infer_response.id == "ch"
    call.add("ch", ("r0", " t1", "", 3, 2, 0, False))  # after the write: a new place
    item = queue.get_nowait()
    assert isinstance(item, _Batch) and call.take(item) is not None
    assert state.channel_batches == 2 and state.channel_entries == 4
