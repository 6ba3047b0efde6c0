"""A fake Triton replica: Triton's real gRPC streaming protocol, a scripted 'model'.

It speaks the replica's tensor interface (see inference/triton_messages.py) so the platform's
real `tritonclient.grpc.aio` code path is exercised without the engine. The model emits
`max_tokens` tokens " t0", " t1", ... (finish_reason "length"), or follows directives found in
the prompt text:
  [invalid]        error "invalid request: ..." before any token
  [fail]           error before any token (a broken replica)
  [slow]           0.05 s between tokens (time for a client to disconnect mid-stream)
  [slow-prefill]   5 s before the first token (time to disconnect before it)
  [die-after-2]    two tokens, then an error
  [stop]           finish_reason "stop" after 3 tokens
  [abort]          finish_reason "abort" after 2 tokens (what a draining engine ends with)
  [request-failed] error "request failed: ..." (this request failed alone inside the engine)
  [kill-engine]    error "engine failed: ..." (the engine died serving it); from then on the
                   fake's engine is dead (`engine_dead`)
Server-wide: `fail_all=True` fails every request before its first token; `engine_dead=True`
refuses every request with "engine dead: ..." (what a replica whose engine died answers).
A `control` input is a usage query (replica/backend/control_request.py): the fake answers from
its own ledger of what it "computed" per request id (`FakeState.usage`).
It serves `replica_running_seqs`/`replica_waiting_seqs` on a tiny HTTP metrics endpoint, like
the real replica.

Run standalone: python -m tests.fakes.triton_server --grpc-port P --metrics-port M
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import warnings
from dataclasses import dataclass, field

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor, triton_to_np_dtype

from replica.metric_names import RUNNING_SEQS, WAITING_SEQS

OUTPUTS = (
    ("text_output", "BYTES"),
    ("finish_reason", "BYTES"),
    ("num_input_tokens", "INT32"),
    ("num_output_tokens", "INT32"),
    ("num_cached_tokens", "INT32"),
    ("final", "BOOL"),
)


def decode_inputs(request) -> dict[str, np.ndarray]:
    values = {}
    for index, tensor in enumerate(request.inputs):
        raw = request.raw_input_contents[index]
        if tensor.datatype == "BYTES":
            values[tensor.name] = deserialize_bytes_tensor(raw)
        else:
            values[tensor.name] = np.frombuffer(raw, dtype=triton_to_np_dtype(tensor.datatype))
    return values


# What the replica sends between a request's first and last response
# (replica/backend/response_stream.py).
LEAN_OUTPUTS = ("text_output", "num_output_tokens", "final")


def _response(model_name: str, request_id: str, outputs) -> service_pb2.ModelStreamInferResponse:
    """A response holding `outputs`: (name, datatype, numpy array) each."""
    response = service_pb2.ModelInferResponse(model_name=model_name, id=request_id)
    for name, datatype, array in outputs:
        response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        raw = serialize_byte_tensor(array).item() if datatype == "BYTES" else array.tobytes()
        response.raw_output_contents.append(raw)
    return service_pb2.ModelStreamInferResponse(infer_response=response)


def _encoded(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _bytes(value: bytes) -> np.ndarray:
    return np.array([value], dtype=np.object_)


def encode_response(request, text: str, finish: str, num_in: int, num_out: int, final: bool,
                    lean: bool = False):
    """A streamed response as the replica builds it; `lean`: one between the first and the
    last, with only LEAN_OUTPUTS."""
    arrays = {
        "text_output": _bytes(text.encode()),
        "finish_reason": _bytes(finish.encode()),
        "num_input_tokens": np.array([num_in], dtype=np.int32),
        "num_output_tokens": np.array([num_out], dtype=np.int32),
        "num_cached_tokens": np.array([0], dtype=np.int32),
        "final": np.array([final], dtype=bool),
    }
    return _response(request.model_name, request.id,
                     [(name, datatype, arrays[name]) for name, datatype in OUTPUTS
                      if not lean or name in LEAN_OUTPUTS])


def control_response(request, payload: dict):
    return _response(request.model_name, request.id, [
        ("control_output", "BYTES", _bytes(json.dumps(payload).encode())),
        ("final", "BOOL", np.array([True], dtype=bool))])


def error_response(request, message: str):
    """A request's failure, naming the request as Triton does (infer_response.id), so a call
    carrying several requests tells whose it is."""
    return service_pb2.ModelStreamInferResponse(
        error_message=message,
        infer_response=service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id))


@dataclass
class FakeState:
    fail_all: bool = False
    engine_dead: bool = False
    num_running: int = 0
    num_requests: int = 0
    requests: list[dict] = field(default_factory=list)  # decoded inputs, for assertions
    usage: dict[str, dict] = field(default_factory=dict)  # request id -> ledger entry
    tasks: dict[str, asyncio.Task] = field(default_factory=dict)  # running, by request id
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # set by every generation
    calls_open: int = 0  # ModelStreamInfer calls open now
    calls_total: int = 0  # ModelStreamInfer calls ever opened
    channels: bool = True  # False: refuses channels, as a replica from before them
    channels_open: int = 0
    channel_batches: int = 0  # batches sent on channels
    channel_entries: int = 0  # outputs sent in them
    batches: bool = True  # False: acknowledges channels without submission batches (older)
    refuse_batches: bool = False  # True: answers every batch with an error (as a whole)
    batches_received: int = 0  # submission batches received


def channel_ack(request, batches: bool = True):
    """A channel's acknowledgement (replica/backend/channel.py): only `control_output`, which
    says whether submission batches are taken."""
    return _response(request.model_name, request.id,
                     [("control_output", "BYTES", _bytes(
                         b'{"channel": "open", "batches": true}' if batches
                         else b'{"channel": "open"}'))])


def channel_batch(model_name: str, channel_id: str, entries: list[tuple]):
    """One batch: (request id, text, finish reason, prompt, output, cached, final) per entry,
    as the JSON list the replica writes (replica/backend/channel.py)."""
    payload = json.dumps(entries, ensure_ascii=False, separators=(",", ":")).encode()
    return _response(model_name, channel_id, [("channel_output", "BYTES", _bytes(payload))])


@dataclass(eq=False)
class _Batch:
    """A channel's place in its call's response queue: the batch is built from the entries
    pending when the call's writer reaches it, so entries produced while earlier responses
    were still being written join it."""

    channel_id: str
    model_name: str
    pending: list


class _Call:
    """One ModelStreamInfer call: its response queue and its channels' pending entries.

    A channel holds at most one place in the queue at a time: entries produced while the call
    is still writing earlier responses gather in the pending batch, as the replica's do while
    its sender thread is busy (replica/backend/channel.py: one flush is scheduled when the
    channel's pending list was empty and takes all of it). One batch per turn of the event
    loop instead queued batches faster than grpc.aio writes them (the fake's tokens cost
    nothing), so a request started into a busy call waited behind dozens of earlier batches
    (median 6.5, p90 76, in benchmarks.gateway's 32-stream rounds) before its first token
    left: a backlog of the fake's own writer, not of the platform."""

    def __init__(self, state: FakeState, queue: asyncio.Queue):
        self.state = state
        self.queue = queue
        self.channels: dict[str, tuple[str, list]] = {}  # id -> (model name, pending)
        self._queued: set[str] = set()  # channels with a _Batch in the queue

    def add(self, channel_id: str, entry: tuple) -> None:
        self.channels[channel_id][1].append(entry)
        self.flush(channel_id)

    def flush(self, channel_id: str) -> None:
        """Puts the channel's pending entries in the queue (joining its place if it has one)."""
        channel = self.channels.get(channel_id)
        if channel is None or not channel[1] or channel_id in self._queued:
            return
        self._queued.add(channel_id)
        self.queue.put_nowait(_Batch(channel_id, channel[0], channel[1]))

    def take(self, batch: _Batch):
        """The response for a batch the writer reached: every entry pending now (None if a
        channel's close already took them)."""
        self._queued.discard(batch.channel_id)
        entries, batch.pending[:] = list(batch.pending), []
        if not entries:
            return None
        self.state.channel_batches += 1
        self.state.channel_entries += len(entries)
        return channel_batch(batch.model_name, batch.channel_id, entries)


class FakeTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, state: FakeState, model_name: str = "chat-small"):
        self.state = state
        self.model_name = model_name

    async def ServerLive(self, request, context):
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context):
        return service_pb2.ModelReadyResponse(ready=request.name == self.model_name)

    async def ModelStreamInfer(self, request_iterator, context):
        queue: asyncio.Queue = asyncio.Queue()
        call = _Call(self.state, queue)
        tasks: set[asyncio.Task] = set()  # one per request in flight on this call

        async def reader():
            async for request in request_iterator:
                task = asyncio.create_task(self._generate(request, queue, call))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks, return_exceptions=True)
            await queue.put(None)

        read_task = asyncio.create_task(reader())
        self.state.calls_open += 1
        self.state.calls_total += 1
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, _Batch):
                    item = call.take(item)
                    if item is None:
                        continue
                yield item
        finally:
            self.state.calls_open -= 1
            self.state.channels_open -= len(call.channels)
            read_task.cancel()
            for task in list(tasks):
                task.cancel()

    async def _generate(self, request, queue: asyncio.Queue, call: _Call) -> None:
        inputs = decode_inputs(request)
        if "control" in inputs:
            command = json.loads(inputs["control"][0])
            if "channel" in command:
                await queue.put(self._channel_command(request, command, call))
                return
            await queue.put(await self._control(request, command))
            return
        if "batch" in inputs:
            await self._batch(request, inputs["batch"][0], queue, call)
            return
        await self._run(request, inputs, queue, call)

    async def _batch(self, request, raw: bytes, queue: asyncio.Queue, call: _Call) -> None:
        """A submission batch (replica/backend/submission_batch.py): each entry runs as a
        request on its channel; the batch itself gets no response (a bare completion)."""
        self.state.batches_received += 1
        if self.state.refuse_batches:
            await queue.put(error_response(request, "invalid request: the fake refuses batches"))
            return
        runs = []
        for entry in json.loads(raw):
            inputs = {name: np.array([_encoded(entry[name])], dtype=np.object_)
                      for name in ("text_input", "sampling_parameters", "tenant", "channel")}
            if "input_ids" in entry:
                inputs["input_ids"] = np.array(entry["input_ids"], dtype=np.int64)
            inputs["priority"] = np.array([entry["priority"]], dtype=np.int32)
            sub = service_pb2.ModelInferRequest(model_name=request.model_name, id=entry["id"])
            runs.append(self._run(sub, inputs, queue, call, in_batch=True))
        await asyncio.gather(*runs)

    async def _run(self, request, inputs: dict, queue: asyncio.Queue, call: _Call,
                   in_batch: bool = False) -> None:
        channel = inputs["channel"][0].decode() if "channel" in inputs else ""
        if channel and channel not in call.channels:
            if in_batch:
                return  # nowhere to answer it (the replica logs and drops it)
            channel = ""  # not open on this call: the request's own responses

        async def fail(message: str) -> None:
            if in_batch:  # no response of its own: its error is an entry on its channel
                call.add(channel, (request.id, message, "error", 0, 0, 0, True))
            else:
                await queue.put(error_response(request, message))
        self.state.num_requests += 1
        self.state.arrived.set()
        text = inputs["text_input"][0].decode() if "text_input" in inputs else ""
        params = json.loads(inputs["sampling_parameters"][0]) if "sampling_parameters" in inputs else {}
        self.state.requests.append({"text": text, "params": params, "request_id": request.id,
                                    "input_ids": inputs.get("input_ids"),
                                    "tenant": inputs["tenant"][0].decode() if "tenant" in inputs else "",
                                    "priority": int(inputs["priority"][0]) if "priority" in inputs else None})
        if request.model_name != self.model_name:
            await fail(f"Request for unknown model: '{request.model_name}'")
            return
        if self.state.engine_dead:
            await fail("engine dead: the engine failed: RuntimeError('fake')")
            return
        if "[invalid]" in text:
            await fail("invalid request: the fake refuses this prompt")
            return
        if "[request-failed]" in text:
            await fail("request failed: the model produced non-finite logits")
            return
        if "[kill-engine]" in text:
            self.state.engine_dead = True
            await fail("engine failed: RuntimeError('fake kernel fault')")
            return
        if self.state.fail_all or "[fail]" in text:
            await fail("engine failure (fake)")
            return
        num_in = len(inputs["input_ids"]) if "input_ids" in inputs else len(text.split())
        max_tokens = int(params.get("max_tokens", 16))
        delay = 0.05 if "[slow]" in text else 0.0
        limit, finish = max_tokens, "length"
        if "[stop]" in text and max_tokens > 3:
            limit, finish = 3, "stop"
        if "[abort]" in text and max_tokens > 2:
            limit, finish = 2, "abort"
        self.state.num_running += 1
        entry = self.state.usage[request.id] = {"state": "running", "input_tokens": num_in,
                                                "cached_tokens": 0, "output_tokens": 0,
                                                "finish_reason": "abort", "error": ""}
        self.state.tasks[request.id] = asyncio.current_task()
        try:
            if "[slow-prefill]" in text:
                await asyncio.sleep(5.0)  # the fake's behaviour: a long prefill
            for index in range(limit):
                if "[die-after-2]" in text and index == 2:
                    if channel:  # its tokens so far go out before its error, as the replica's
                        call.flush(channel)
                    await fail("engine died mid-stream (fake)")
                    return
                last = index == limit - 1
                entry["output_tokens"] = index + 1
                if last:
                    entry["finish_reason"] = finish
                if channel:  # one token per turn of the loop, into the channel's pending batch
                    call.add(channel, (request.id, f" t{index}", finish if last else "", num_in,
                                       index + 1, 0, last))
                else:
                    await queue.put(encode_response(request, f" t{index}",
                                                    finish if last else "", num_in, index + 1,
                                                    last, lean=0 < index < limit - 1))
                await asyncio.sleep(delay)  # the fake's behaviour: `[slow]` pacing
        finally:
            self.state.num_running -= 1
            entry["state"] = "finished"
            self.state.tasks.pop(request.id, None)

    def _channel_command(self, request, command: dict, call: _Call):
        channel_id = command["channel"]
        if not self.state.channels:
            return error_response(request, "invalid request: control.usage must be a list of "
                                           "at most 1000 request ids")
        if command.get("open"):
            call.channels[channel_id] = (request.model_name, [])
            self.state.channels_open += 1
            return channel_ack(request, self.state.batches)
        call.flush(channel_id)
        if call.channels.pop(channel_id, None) is not None:
            self.state.channels_open -= 1
        return control_response(request, {"channel": "closed"})

    async def _control(self, request, command: dict):
        ids = command["usage"]
        if command.get("abort"):
            for task in [self.state.tasks.get(i) for i in ids]:
                if task is not None:
                    task.cancel()
        unknown = {"state": "unknown", "input_tokens": 0, "cached_tokens": 0,
                   "output_tokens": 0, "finish_reason": "", "error": ""}
        # Up to wait_s for the running ones to end: each generation is its own task (it marks
        # its ledger entry finished as it ends).
        running = [task for task in (self.state.tasks.get(i) for i in ids) if task is not None]
        wait_s = float(command.get("wait_s", 0.0))
        if running and wait_s > 0:
            await asyncio.wait(running, timeout=wait_s)
        return control_response(request, {"usage": {i: dict(self.state.usage.get(i, unknown))
                                                     for i in ids}})


async def _serve_metrics(state: FakeState, reader, writer) -> None:
    try:
        await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):  # a port probe, not a request
        writer.close()
        return
    body = (f"# TYPE {RUNNING_SEQS} gauge\n"
            f"{RUNNING_SEQS}{{model=\"chat-small\",version=\"1\"}} {state.num_running}\n"
            f"{WAITING_SEQS}{{model=\"chat-small\",version=\"1\"}} 0\n").encode()
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    await writer.drain()
    writer.close()


@dataclass
class RunningFake:
    state: FakeState
    grpc_port: int
    metrics_port: int
    server: grpc.aio.Server
    metrics_server: asyncio.AbstractServer

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_address(self) -> str:
        return f"127.0.0.1:{self.metrics_port}"

    async def stop(self) -> None:
        self.metrics_server.close()
        # grpc.aio's stop can hang when a streaming RPC was cancelled around it
        # (grpc/grpc#28999); the fake is then left to the process exit, not waited on forever.
        try:
            async with asyncio.timeout(10):
                await self.server.stop(grace=None)
        except TimeoutError:
            warnings.warn("the fake Triton's grpc.aio server did not stop within 10 s")


async def start_fake(grpc_port: int = 0, metrics_port: int = 0, fail_all: bool = False) -> RunningFake:
    state = FakeState(fail_all=fail_all)
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(FakeTriton(state), server)
    port = server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await server.start()
    metrics = await asyncio.start_server(lambda r, w: _serve_metrics(state, r, w),
                                         "127.0.0.1", metrics_port)
    return RunningFake(state, port, metrics.sockets[0].getsockname()[1], server, metrics)


def parse_gauge(metrics_text: str, name: str) -> int:
    """The value of a gauge in Prometheus text format; -1 when absent."""
    match = re.search(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", metrics_text, re.M)
    return int(float(match.group(1))) if match else -1


def parse_active_seqs(metrics_text: str) -> int:
    """Running + waiting sequences, as the real replica reports them on its metrics port."""
    running = parse_gauge(metrics_text, RUNNING_SEQS)
    waiting = parse_gauge(metrics_text, WAITING_SEQS)
    if running < 0 or waiting < 0:
        raise ValueError(f"no {RUNNING_SEQS} / {WAITING_SEQS} gauges in:\n" + metrics_text)
    return running + waiting


async def _main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--fail-all", action="store_true")
    args = parser.parse_args()
    fake = await start_fake(args.grpc_port, args.metrics_port, args.fail_all)
    print(f"fake triton on {fake.grpc_address}, metrics {fake.metrics_address}", flush=True)
    await fake.server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(_main())
