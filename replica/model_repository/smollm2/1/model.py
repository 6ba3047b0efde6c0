"""Our engine as a decoupled Triton Python-backend model.

`execute` validates each request, stores its response sender and hands it to the EngineLoop, then
returns at once; the loop thread sends one response per engine step per request. The engine's
request id is Triton's (the platform's request id) unless absent or already open. Every finished
request's computed tokens go to the UsageLedger before its final response; a `control` request
reads the ledger (and may abort requests) instead of generating; a `batch` request carries
several generation requests, each submitted as a request on the channel it names, and is
completed at once (replica/backend/submission_batch.py). Needs the
repository root on PYTHONPATH (the launcher sets it) and the venv's python first on PATH.

Errors reach the platform by their message's prefix (replica/backend/error_messages.py). If the
engine loop dies, every later request is refused with "engine dead:", the gauge
`replica_engine_alive` drops to 0 and the reason is written to the `engine_dead_file`, which the
launcher watches: it stops the server, so Triton's model readiness turns false and the fleet
replaces the replica (Triton 2.51's Python backend has no way to mark a loaded model not ready).
"""
from __future__ import annotations

import gc
import json
import logging
import os
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# The stub's embedded interpreter ignores PYTHONPATH (measured): honour it here, before our imports.
for _path in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)

import triton_python_backend_utils as pb_utils  # noqa: E402

from replica.backend import error_messages
from replica.backend.channel import Channel
from replica.backend.control_request import ChannelCommand, ControlRequest, control_reply, parse_control
from replica.backend.drain_watcher import DrainWatcher
from replica.backend.engine_metrics import EngineMetrics
from replica.backend.vllm_metrics import VllmMetrics
from replica.backend.fault_trigger import FaultTrigger
from replica.backend.generate_request import INPUT_NAMES, GenerateRequest
from replica.backend.model_parameters import ModelParameters
from replica.backend.response_stream import ResponseStream, finish_reason_of
from replica.backend.submission_batch import SubRequest, parse_batch
from replica.backend.usage_ledger import FINISHED, ComputedUsage, UsageLedger
from replica.engine.engine_loop import EngineDeadError, EngineLoop, EngineUnavailableError
from replica.engine.sampling_params import InvalidRequestError

_log = logging.getLogger("replica.model")


CHANNEL_WATCH_S = 0.5  # how often channels are checked for a stream that is gone


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        from replica.engine.dtype import dtype_name
        from replica.engine.llm_engine import LLMEngine
        from replica.engine.models.loader import default_model_path

        model_config = json.loads(args["model_config"])
        parameters = ModelParameters.from_model_config(model_config)
        engine_config = parameters.engine_config(default_weights=str(default_model_path()))
        _log.info("loading %s (%s, quantization %s)", engine_config.model_path, engine_config.dtype,
                  engine_config.quantization)
        self._engine = LLMEngine.from_config(engine_config)
        self._tokenizer = self._engine.tokenizer
        self._streams: dict[str, ResponseStream] = {}
        self._streams_lock = threading.Lock()
        self._channels: dict[str, Channel] = {}  # open channels by id (replica/backend/channel.py)
        self._channels_stop = threading.Event()
        info = {"dtype": dtype_name(self._engine.dtype), "quantization": engine_config.quantization}
        _log.info("loaded: compute dtype %s (asked %s), quantization %s", info["dtype"], engine_config.dtype,
                  info["quantization"])
        self._metrics = EngineMetrics(pb_utils, {"model": args["model_name"], "version": args["model_version"]},
                                      info)
        self._vllm_metrics = VllmMetrics(pb_utils, args["model_name"])  # vLLM's names, for routers
        # Responses go out on one sender thread, in order: a send blocks ~0.3-1 ms on IPC with the
        # server (GIL released), which then overlaps the next engine step instead of delaying it.
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="response-sender")
        self._engine_dead_file = parameters.engine_dead_file
        self._ledger = UsageLedger()
        # Control requests may wait for requests to finish: off the sender and loop threads.
        self._control = ThreadPoolExecutor(max_workers=2, thread_name_prefix="control")
        # The gauges hold the pool's real size from the start, not only after the first tick:
        # a replica that had served nothing reported 0 free of 0 KV blocks, which routing read
        # as a full pool and so sent it nothing while the others had room (round frontdoor11).
        stats = self._engine.stats()
        self._metrics.update(stats)
        self._vllm_metrics.update(stats)
        self._loop = EngineLoop(self._engine, on_tick=self._on_tick, on_dead=self._on_dead)
        self._loop.start()
        threading.Thread(target=self._watch_channels, name="channel-watch", daemon=True).start()
        self._engine.on_failure(self._loop.inject_fault)  # a dead tensor-parallel worker kills the loop
        self._fault_trigger = None
        if parameters.fault_file:
            self._fault_trigger = FaultTrigger(parameters.fault_file, self._loop.inject_fault)
            self._fault_trigger.start()
        self._drain_watcher = None
        if parameters.drain_file:
            self._drain_watcher = DrainWatcher(
                parameters.drain_file,
                self._loop.drain,
                self._loop.wait_drained,
                default_grace_s=parameters.drain_grace_s,
            )
            self._drain_watcher.start()
        # The model, the tokenizer and the engine live as long as this process: out of the
        # collector's view, a full collection no longer walks them (it paused the engine loop
        # 166 ms under load before, every replica request waiting).
        gc.collect()
        gc.freeze()
        _log.info("ready: max_model_len=%d", self._engine.max_model_len)

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                control = pb_utils.get_input_tensor_by_name(request, "control")
                if control is not None:
                    command = parse_control(control.as_numpy())
                    if isinstance(command, ChannelCommand):
                        self._channel_command(command, sender)
                    else:
                        self._control.submit(self._answer_control, command, sender)
                    continue
                batch = pb_utils.get_input_tensor_by_name(request, "batch")
                if batch is not None:
                    self._submit_batch(batch.as_numpy(), sender)
                    continue
                self._submit(request, sender)
            except InvalidRequestError as exc:
                _send_error(sender, f"{error_messages.INVALID_REQUEST} {exc}", pb_utils.TritonError.INVALID_ARG)
            except EngineDeadError as exc:
                _send_error(sender, f"{error_messages.ENGINE_DEAD} {exc}", pb_utils.TritonError.UNAVAILABLE)
            except EngineUnavailableError as exc:
                _send_error(sender, f"{error_messages.UNAVAILABLE} {exc}", pb_utils.TritonError.UNAVAILABLE)
            except Exception as exc:  # noqa: BLE001 - one bad request must not fail the batch
                _log.exception("request failed")
                _send_error(sender, f"{error_messages.REQUEST_FAILED} {exc!r}", pb_utils.TritonError.INTERNAL)
        return None

    def finalize(self) -> None:
        _log.info("finalize: stopping the engine loop")
        if self._drain_watcher is not None:
            self._drain_watcher.stop()
        if self._fault_trigger is not None:
            self._fault_trigger.stop()
        self._loop.stop()
        self._engine.close()  # tensor-parallel workers, if any
        self._control.shutdown(wait=False, cancel_futures=True)
        self._channels_stop.set()
        with self._streams_lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:  # after the final responses the loop just produced
            self._sender.submit(self._close_channel, channel)
        self._sender.shutdown(wait=True)  # flush the final responses the loop just produced
        self._metrics.close()  # metrics before their families, before the stub tears down
        self._vllm_metrics.close()
        _log.info("finalize: done; engine loop: %s", self._loop.timing.summary())

    def _submit(self, request, sender) -> None:
        inputs = {}
        for name in INPUT_NAMES:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            inputs[name] = None if tensor is None else tensor.as_numpy()
        generate = GenerateRequest.from_inputs(inputs)
        self._start(generate, request.request_id() or "", sender)

    def _submit_batch(self, array, sender) -> None:
        """Execute thread: submit a batch's sub-requests, then complete the batch's request
        (a bare final flag: nothing reaches the client). A batch malformed as a whole raises
        InvalidRequestError (answered on its own sender, as a lone request)."""
        for sub in parse_batch(array):
            self._submit_sub(sub)
        try:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:  # noqa: BLE001 - its sub-requests are submitted; nothing to answer
            _log.warning("completing a batch request failed", exc_info=True)

    def _submit_sub(self, sub: SubRequest) -> None:
        """Execute thread: one sub-request of a batch, on its channel; its error (invalid,
        refused, failed) is its one entry there, sent by the sender thread."""
        with self._streams_lock:
            channel = self._channels.get(sub.channel)
        request_id = self._engine_request_id(sub.id)
        if channel is None or not channel.start(request_id):  # it could be answered nowhere
            _log.warning("request %s: no open channel %s; dropped", sub.id, sub.channel)
            return
        try:
            if isinstance(sub.inputs, InvalidRequestError):
                raise sub.inputs
            self._start(GenerateRequest.from_inputs(sub.inputs), request_id, None, channel)
        except InvalidRequestError as exc:
            message = f"{error_messages.INVALID_REQUEST} {exc}"
        except EngineDeadError as exc:
            message = f"{error_messages.ENGINE_DEAD} {exc}"
        except EngineUnavailableError as exc:
            message = f"{error_messages.UNAVAILABLE} {exc}"
        except Exception as exc:  # noqa: BLE001 - one bad request must not fail the batch
            _log.exception("request %s failed", request_id)
            message = f"{error_messages.REQUEST_FAILED} {exc!r}"
        else:
            if not channel.taking:  # closed while it was submitted: stop_running missed it
                self._loop.abort(request_id)
            return
        channel.end(request_id)
        # Under the platform's id: a fresh one (_engine_request_id) is known to nobody yet.
        self._sender.submit(self._send_sub_error, channel, sub.id, message)

    def _send_sub_error(self, channel: Channel, request_id: str, message: str) -> None:
        """Sender thread: a sub-request's error entry, after the entries queued before it."""
        if channel.add_error(request_id, message):
            self._sender.submit(channel.flush)

    def _engine_request_id(self, request_id: str) -> str:
        """Triton's request id (the platform sends its own request id) names the request in this
        replica's logs; a missing, overlong or already known one gets a fresh id."""
        known = request_id and self._ledger.lookup([request_id])[request_id].state != "unknown"
        if not request_id or len(request_id) > 128 or known:
            request_id = uuid.uuid4().hex  # no id, or one this replica already holds
        return request_id

    def _start(self, generate: GenerateRequest, request_id: str, sender,
               sub_channel: Channel | None = None) -> None:
        """Execute thread: tokenize, register and submit one request. `sender` None: a
        sub-request of a batch, on `sub_channel`, its id already chosen (_engine_request_id)."""
        if generate.prompt_token_ids is not None:
            prompt_token_ids = list(generate.prompt_token_ids)
        else:
            prompt_token_ids = self._tokenizer.encode(generate.text)
        prefix = ""
        if generate.prepend_prompt:
            if not generate.text:  # ids the engine refuses (the loop's submit below) never reach the decoder
                self._engine.check_prompt(prompt_token_ids)
            prefix = generate.text or self._tokenizer.decode(prompt_token_ids)
        if sender is not None:
            request_id = self._engine_request_id(request_id)
        _log.info("request %s: %d prompt tokens, max_tokens %s", request_id, len(prompt_token_ids),
                  generate.params.max_tokens)
        self._vllm_metrics.arrived(request_id)
        channel = sub_channel
        if sender is not None and generate.channel:
            with self._streams_lock:
                channel = self._channels.get(generate.channel)
            if channel is None:  # closed meanwhile, or never opened: its own responses
                _log.warning("request %s: no open channel %s; answering on its own", request_id,
                             generate.channel)
        stream = ResponseStream(
            pb_utils, sender, request_id, stream=generate.stream, prompt_prefix=prefix, on_cancel=self._loop.abort,
            channel=channel,
            schedule_flush=None if channel is None else (lambda: self._sender.submit(channel.flush)),
        )
        with self._streams_lock:
            self._streams[request_id] = stream
        self._ledger.open(request_id)
        try:
            self._loop.submit(
                request_id,
                prompt_token_ids,
                generate.params,
                generate.priority,
                generate.tenant,
                generate.cache_salt,
                on_output=lambda output: self._on_output(stream, output),
            )
        except BaseException:
            self._forget(request_id)
            self._ledger.forget(request_id)
            self._vllm_metrics.forget(request_id)
            raise

    def _on_output(self, stream: ResponseStream, output) -> None:
        """Loop thread: record a finished request's usage, hand the output to the sender thread."""
        if output.finished:
            finish_reason = finish_reason_of(output)
            self._ledger.close(stream.request_id, ComputedUsage(
                FINISHED, output.num_prompt_tokens, output.num_cached_tokens,
                output.num_output_tokens, finish_reason, output.error or ""))
        self._sender.submit(self._send_output, stream, output)

    def _send_output(self, stream: ResponseStream, output) -> None:
        """Sender thread: the only thread that touches a ResponseStream after submit."""
        try:
            # Observed before the send: a client that has the response also sees it counted.
            self._vllm_metrics.output(stream.request_id, output.num_output_tokens, output.finished)
            stream.on_output(output)
        except Exception as exc:  # noqa: BLE001 - the client is gone or the response is bad: end it
            _log.exception("sending a response for %s failed; aborting it", stream.request_id)
            self._loop.abort(stream.request_id)
            try:  # Triton must still see a final flag, or the request stays in flight forever
                stream.fail(f"{error_messages.REQUEST_FAILED} sending a response failed: {exc!r}",
                            pb_utils.TritonError.INTERNAL)
            except Exception:  # noqa: BLE001
                stream.closed = True
        finally:
            if output.finished:
                self._forget(stream.request_id)
                self._vllm_metrics.forget(stream.request_id)
                if stream.channel is not None:  # a sub-request no longer runs on it
                    stream.channel.end(stream.request_id)

    def _answer_control(self, command: ControlRequest, sender) -> None:
        """Control thread: abort if asked, wait, answer with the ledger's entries."""
        try:
            if command.abort:
                for request_id in command.request_ids:
                    self._loop.abort(request_id)
            usage = self._ledger.wait(command.request_ids, command.wait_s)
            _send_control_reply(sender, control_reply(usage))
        except Exception as exc:  # noqa: BLE001 - answer every request with a final response
            _log.exception("control request failed")
            _send_error(sender, f"{error_messages.REQUEST_FAILED} {exc!r}", pb_utils.TritonError.INTERNAL)

    def _channel_command(self, command: ChannelCommand, sender) -> None:
        """Execute thread: open a channel (this request becomes it) or close one (this request
        is answered once the channel's request completed). Sent on the sender thread, in order
        with the outputs."""
        if command.open:
            channel = Channel(pb_utils, sender, command.channel)
            with self._streams_lock:
                if command.channel in self._channels:
                    raise InvalidRequestError(f"channel {command.channel} is already open")
                self._channels[command.channel] = channel
            self._sender.submit(channel.acknowledge)
            return
        with self._streams_lock:
            channel = self._channels.pop(command.channel, None)

        def close() -> None:
            if channel is not None:
                self._close_channel(channel)
            _send_control_reply(sender, b'{"channel":"closed"}')

        self._sender.submit(close)

    def _watch_channels(self) -> None:
        """Watch thread: a channel whose stream is gone (the platform process died, its
        connection dropped) is completed, busy engine or not: Triton does not unload a model
        with a request in flight."""
        while not self._channels_stop.wait(CHANNEL_WATCH_S):
            with self._streams_lock:
                channels = list(self._channels.values())
            gone = [channel for channel in channels if channel.gone()]  # IPC: off the lock
            with self._streams_lock:
                for channel in gone:
                    self._channels.pop(channel.channel_id, None)
            for channel in gone:
                self._sender.submit(self._close_gone, channel)

    def _close_gone(self, channel: Channel) -> None:
        try:
            self._close_channel(channel)
        except Exception:  # noqa: BLE001 - its stream is gone
            channel.closed = True

    def _close_channel(self, channel: Channel) -> None:
        """Sender thread: abort the sub-requests still running on it (their outputs could reach
        no one), then flush and complete it."""
        for request_id in channel.stop_running():
            self._loop.abort(request_id)
        channel.close()

    def _forget(self, request_id: str) -> None:
        with self._streams_lock:
            self._streams.pop(request_id, None)

    def _on_dead(self, exc: BaseException) -> None:
        """Loop thread, once, as it dies (its open requests already got their error outputs)."""
        _log.error("the engine loop died: %r; this replica serves nothing more", exc)
        self._sender.submit(self._metrics.set_alive, False)
        if self._engine_dead_file:
            try:
                tmp = self._engine_dead_file + ".tmp"
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(f"{exc!r}\n")
                os.replace(tmp, self._engine_dead_file)  # atomic: the launcher never reads half
            except OSError:
                _log.exception("could not write %s", self._engine_dead_file)

    def _on_tick(self, stats) -> None:
        """Loop thread, every tick while busy and once on going idle."""
        self._sender.submit(self._publish, stats)

    def _publish(self, stats) -> None:
        """Sender thread: metrics, and cancellation polls for requests that produce nothing."""
        try:
            self._metrics.update(stats)
            self._vllm_metrics.update(stats)
            with self._streams_lock:
                streams = list(self._streams.values())
            for stream in streams:
                stream.poll_idle()
        except Exception:  # noqa: BLE001 - best effort; never kill the sender thread
            _log.exception("publishing metrics failed")


def _send_control_reply(sender, payload: bytes) -> None:
    """A control request's one, final response: `control_output` holding `payload` (JSON)."""
    output = pb_utils.Tensor("control_output", np.array([payload], dtype=np.object_))
    final = pb_utils.Tensor("final", np.array([True], dtype=np.bool_))
    sender.send(pb_utils.InferenceResponse(output_tensors=[output, final]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def _send_error(sender, message: str, code) -> None:
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    sender.send(
        pb_utils.InferenceResponse(output_tensors=[], error=error),
        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    )
