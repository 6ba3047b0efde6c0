"""ResponseStream: turns one request's RequestOutput deltas into Triton responses.

Outputs, mirroring Triton's vLLM backend plus our extras: `text_output` (the text delta),
`finish_reason` ("" until the last response), `num_input_tokens`, `num_output_tokens`,
`num_cached_tokens` and `final` (true on the last response; the aio gRPC client refuses
`triton_` parameters, so the end of a stream is also an output). The last response also carries
Triton's COMPLETE_FINAL flag.

The first and the last response carry all six; the ones between carry only what changes from
token to token (`text_output`, `num_output_tokens`, `final`): a response's outputs are built
here per token and per sequence, on the model's sender thread, and read per token by the platform
(three fewer tensors to build, send and parse; a reader keeps the first response's counts).

Invariants: exactly one response carries the final flag; with `stream=False` it is the only one.
With a `channel` (replica/backend/channel.py) every output is an entry of the channel's batches
instead, and the request completes with a bare final flag; errors still go out on its own sender.
With a channel and no sender (`sender=None`: a sub-request of a submission batch,
replica/backend/submission_batch.py) there is nothing to complete: the last entry ends it, and
its error is one entry of the channel (`Channel.add_error`) after the entries before it; it is
never polled for cancellation (the channel's closer aborts it).
`on_output` runs on the model's sender thread; `is_cancelled()` costs ~60 us, so it is polled
every `poll_every` outputs and, for requests that produce nothing (still waiting), by `poll_idle`.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from replica.backend.error_messages import output_error_message
from replica.engine.request import ErrorKind, RequestOutput


class ResponseStream:
    def __init__(
        self,
        pb_utils: Any,
        sender: Any,
        request_id: str,
        *,
        stream: bool,
        prompt_prefix: str = "",
        on_cancel: Callable[[str], None],
        poll_every: int = 8,
        channel: Any = None,
        schedule_flush: Callable[[], None] | None = None,
    ) -> None:
        if sender is None and channel is None:
            raise ValueError("a ResponseStream without a sender needs a channel")
        self._pb = pb_utils
        self._sender = sender
        self.request_id = request_id
        self._stream = stream
        self._pending_prefix = prompt_prefix  # sent ahead of the first text (vLLM's prepend)
        self._on_cancel = on_cancel
        self._poll_every = poll_every
        self._text_parts: list[str] = []  # stream=False: the whole text so far
        self._num_outputs = 0
        self._sent_any = False  # the first response carries every output
        # Outputs go to a channel (replica/backend/channel.py) as entries; `schedule_flush`
        # sends the channel's batch after the outputs already queued for the sender thread.
        self._channel = channel
        self._schedule_flush = schedule_flush
        self._num_outputs_at_last_idle_check = 0
        self._cancel_requested = False
        self.closed = False

    def on_output(self, output: RequestOutput) -> None:
        if self.closed:
            return
        self._num_outputs += 1
        if output.error is not None:
            codes = {ErrorKind.INVALID_INPUT: self._pb.TritonError.INVALID_ARG,
                     ErrorKind.ENGINE_DEAD: self._pb.TritonError.UNAVAILABLE}
            self.fail(output_error_message(output.error_kind, output.error),
                      codes.get(output.error_kind, self._pb.TritonError.INTERNAL))
            return
        text = output.text_delta
        if self._pending_prefix:
            text, self._pending_prefix = self._pending_prefix + text, ""
        if not self._stream:
            self._text_parts.append(text)
            if not output.finished:
                self._maybe_poll()
                return
            text = "".join(self._text_parts)
        if self._channel is not None:
            self._to_channel(text, output)
        else:
            self._send(self._response(text, output), final=output.finished)
        if not output.finished:
            self._maybe_poll()

    def _to_channel(self, text: str, output: RequestOutput) -> None:
        if self._channel.add((self.request_id, text, finish_reason_of(output), output.num_prompt_tokens,
                              output.num_output_tokens, output.num_cached_tokens,
                              output.finished)):
            self._schedule_flush()
        if output.finished:  # Triton's request completes; its last entry is in the channel
            self.closed = True
            if self._sender is not None:  # a sub-request has no Triton request to complete
                self._sender.send(flags=self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def fail(self, message: str, code: Any = None) -> None:
        """End the stream with an error response (the request only; the model keeps serving);
        without a sender, with an error entry on its channel (`code` unused: the message's
        prefix tells the kind)."""
        if self.closed:
            return
        if self._sender is None:  # a sub-request: its error is its last entry on the channel
            self.closed = True
            if self._channel.add_error(self.request_id, message):
                self._schedule_flush()
            return
        error = self._pb.TritonError(message) if code is None else self._pb.TritonError(message, code)
        if self._channel is not None:  # its outputs so far go out before its error
            self._channel.flush()
        self._send(self._pb.InferenceResponse(output_tensors=[], error=error), final=True)

    @property
    def channel(self) -> Any:
        """The channel its outputs go out on (None: its own sender)."""
        return self._channel

    def poll_idle(self) -> None:
        """Called periodically: poll cancellation if nothing was produced since the last call."""
        if self.closed or self._sender is None:
            return
        if self._num_outputs == self._num_outputs_at_last_idle_check:
            self._poll()
        self._num_outputs_at_last_idle_check = self._num_outputs

    def _maybe_poll(self) -> None:
        if self._sender is not None and self._num_outputs % self._poll_every == 0:
            self._poll()

    def _poll(self) -> None:
        if not self._cancel_requested and self._sender.is_cancelled():
            self._cancel_requested = True
            self._on_cancel(self.request_id)

    def _send(self, response: Any, *, final: bool) -> None:
        if final:
            self.closed = True
            self._sender.send(response, flags=self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        else:
            self._sender.send(response)

    def _response(self, text: str, output: RequestOutput) -> Any:
        tensor = self._pb.Tensor
        if self._sent_any and not output.finished:
            return self._pb.InferenceResponse(
                output_tensors=[
                    tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_)),
                    tensor("num_output_tokens", np.array([output.num_output_tokens], dtype=np.int32)),
                    tensor("final", np.array([False], dtype=np.bool_)),
                ]
            )
        self._sent_any = True
        finish_reason = finish_reason_of(output)
        return self._pb.InferenceResponse(
            output_tensors=[
                tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_)),
                tensor("finish_reason", np.array([finish_reason.encode("utf-8")], dtype=np.object_)),
                tensor("num_input_tokens", np.array([output.num_prompt_tokens], dtype=np.int32)),
                tensor("num_output_tokens", np.array([output.num_output_tokens], dtype=np.int32)),
                tensor("num_cached_tokens", np.array([output.num_cached_tokens], dtype=np.int32)),
                tensor("final", np.array([output.finished], dtype=np.bool_)),
            ]
        )


def finish_reason_of(output: RequestOutput) -> str:
    """"" until the last output, then its reason (stop | length | abort)."""
    if not output.finished or output.finish_reason is None:
        return ""
    return getattr(output.finish_reason, "value", str(output.finish_reason))
