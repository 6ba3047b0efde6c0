"""Channel: one open request whose responses carry the outputs of many others, batched.

A platform process reads a replica through a few long-lived gRPC streams, each carrying many
requests. Sent one response per token and request, every token costs a response: on the
replica, a Triton response built and sent through the stub's IPC by the one sender thread
(0.3-1 ms each, GIL released); on the platform, a gRPC message read, parsed and handed to its
request. A channel sends instead, per flush, one response holding every output its requests
produced since the last one (an engine step's tokens of all the requests on that stream).

- Opened by a control request `{"channel": id, "open": true}` (control_request.ChannelCommand):
  that request stays open, answered first by an acknowledgement (`control_output`
  `{"channel": "open", "batches": true}`: this replica also takes submission batches), then by
  the batches; `{"channel": id, "close": true}` (another request) flushes it and completes the
  channel's request (so a stream the platform half-closes can end, and Triton can unload the
  model). A channel whose stream is gone (`is_cancelled`) is dropped.
- A generation request that names an open channel (input `channel`) sends its outputs there:
  every output as one entry of a batch (its request id, text delta, finish reason, prompt /
  output / cached token counts, final), and, after its last, a bare completion on its own
  sender (Triton's COMPLETE_FINAL flag, no response: nothing reaches the client). Its errors
  still go out on its own sender, as an error response naming it. A request naming an unknown
  channel streams on its own sender, as without one.
- A sub-request of a submission batch (replica/backend/submission_batch.py) names its channel
  too, but has no Triton request or sender of its own: its outputs are entries as above, with
  no completion after the last, and its error (at submission or later) is one entry
  `[request id, error message, "error", 0, 0, 0, true]`, the message with its prefix as an
  error response would carry it (replica/backend/error_messages.py), after the request's
  outputs before it. Nothing polls it for cancellation: the channel keeps the ids of its
  sub-requests still running (`start` / `end`), and whoever closes the channel (by command,
  its stream gone, or the model's finalize) aborts those (`stop_running`), so a platform
  process that dies mid-stream leaves nothing generating. A sub-request naming a channel that
  is not open is answered nowhere: it is dropped.
- A batch is one output, `channel_output`: one element, the JSON list of its entries, each
  `[request id, text delta, finish reason, prompt tokens, output tokens, cached tokens,
  final]` (one C call to write and to read, where seven tensors of one element per entry
  cost the platform ~8 us per entry to read).

Threads: `add` and `flush` run on the model's sender thread only (the sender executor runs one
task at a time, in order), so entries leave in the order their outputs were produced. The
running set is shared by the execute thread (`start`) and the sender thread, under a lock.
"""
from __future__ import annotations

import json
import logging
import threading
from typing import Any

import numpy as np

_log = logging.getLogger(__name__)

ACK = json.dumps({"channel": "open", "batches": True}).encode()
ERROR = "error"  # the finish reason of a sub-request's error entry

# (request id, text, finish reason, prompt tokens, output tokens, cached tokens, final)
Entry = tuple[str, str, str, int, int, int, bool]


class Channel:
    def __init__(self, pb_utils: Any, sender: Any, channel_id: str) -> None:
        self._pb = pb_utils
        self._sender = sender
        self.channel_id = channel_id
        self._pending: list[Entry] = []
        self.closed = False
        # Sub-requests of submission batches still running on it (ids), and whether it still
        # takes new ones.
        self._running: set[str] = set()
        self._running_lock = threading.Lock()
        self._taking = True
        # Held by `close` around its final response and by `gone` around its cancellation
        # check (the watch thread's): Triton frees a request's response factory once its final
        # response is sent, and asking a freed factory whether it was cancelled crashed
        # tritonserver (SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled, round
        # frontdoor14's routing run: a close command raced the watch thread).
        self._final_lock = threading.Lock()

    def add(self, entry: Entry) -> bool:
        """Queue one output; True when the channel held nothing (the caller schedules a flush
        behind the outputs already queued for the sender thread)."""
        was_empty = not self._pending
        self._pending.append(entry)
        return was_empty

    def add_error(self, request_id: str, message: str) -> bool:
        """Queue a sub-request's error as its one last entry; as `add`."""
        return self.add((request_id, message, ERROR, 0, 0, 0, True))

    def start(self, request_id: str) -> bool:
        """A sub-request is about to be submitted on it; False when it takes none any more
        (being closed: the sub-request has nowhere to go)."""
        with self._running_lock:
            if self._taking:
                self._running.add(request_id)
            return self._taking

    def end(self, request_id: str) -> None:
        """A sub-request had its final output or error (or was never submitted)."""
        with self._running_lock:
            self._running.discard(request_id)

    @property
    def taking(self) -> bool:
        """It still takes sub-requests: checked after a submit, so that one started while it
        was being closed is aborted by its submitter if `stop_running` missed it."""
        with self._running_lock:
            return self._taking

    def stop_running(self) -> list[str]:
        """Take no more sub-requests; the ids of those still running (the closer aborts them)."""
        with self._running_lock:
            self._taking = False
            running, self._running = list(self._running), set()
        return running

    def acknowledge(self) -> None:
        tensor = self._pb.Tensor("control_output", np.array([ACK], dtype=np.object_))
        self._sender.send(self._pb.InferenceResponse(output_tensors=[tensor]))

    def flush(self) -> None:
        """One response with every queued entry (nothing when none, or closed)."""
        entries, self._pending = self._pending, []
        if not entries or self.closed:
            return
        # errors="replace": a lone surrogate in a text delta must not lose the whole batch.
        payload = json.dumps(entries, ensure_ascii=False,
                             separators=(",", ":")).encode("utf-8", errors="replace")
        try:
            self._sender.send(self._pb.InferenceResponse(output_tensors=[
                self._pb.Tensor("channel_output", np.array([payload], dtype=np.object_))]))
        except Exception:  # noqa: BLE001 - its stream is gone: the watch thread closes it
            _log.warning("channel %s: a batch of %d could not be sent", self.channel_id,
                         len(entries), exc_info=True)

    def close(self) -> None:
        """Flush what is queued, then complete the channel's request."""
        if self.closed:
            return
        self.flush()
        with self._final_lock:
            self.closed = True
            self._sender.send(flags=self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def gone(self) -> bool:
        """The stream that opened it is gone (its client cancelled or disconnected). False
        for a channel already completed: its request is Triton's no more to ask about."""
        with self._final_lock:
            return not self.closed and self._sender.is_cancelled()
