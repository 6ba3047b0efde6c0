"""Channel: one open request whose responses carry the outputs of many others, batched.

A platform process reads a replica through a few long-lived gRPC streams, each carrying many
requests. Sent one response per token and request, every token costs a response: on the
replica, a Triton response built and sent through the stub's IPC by the one sender thread
(0.3-1 ms each, GIL released); on the platform, a gRPC message read, parsed and handed to its
request. A channel sends instead, per flush, one response holding every output its requests
produced since the last one (an engine step's tokens of all the requests on that stream).

- Opened by a control request `{"channel": id, "open": true}` (control_request.ChannelCommand):
  that request stays open, answered first by an acknowledgement (`control_output`
  `{"channel": "open"}`), then by the batches; `{"channel": id, "close": true}` (another
  request) flushes it and completes the channel's request (so a stream the platform
  half-closes can end, and Triton can unload the model). A channel whose stream is gone
  (`is_cancelled`) is dropped.
- A generation request that names an open channel (input `channel`) sends its outputs there:
  every output as one entry of a batch (its request id, text delta, finish reason, prompt /
  output / cached token counts, final), and, after its last, a bare completion on its own
  sender (Triton's COMPLETE_FINAL flag, no response: nothing reaches the client). Its errors
  still go out on its own sender, as an error response naming it. A request naming an unknown
  channel streams on its own sender, as without one.
- A batch is one output, `channel_output`: one element, the JSON list of its entries, each
  `[request id, text delta, finish reason, prompt tokens, output tokens, cached tokens,
  final]` (one C call to write and to read, where seven tensors of one element per entry
  cost the platform ~8 us per entry to read).

Threads: `add` and `flush` run on the model's sender thread only (the sender executor runs one
task at a time, in order), so entries leave in the order their outputs were produced.
"""
from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

_log = logging.getLogger(__name__)

ACK = json.dumps({"channel": "open"}).encode()

# (request id, text, finish reason, prompt tokens, output tokens, cached tokens, final)
Entry = tuple[str, str, str, int, int, int, bool]


class Channel:
    def __init__(self, pb_utils: Any, sender: Any, channel_id: str) -> None:
        self._pb = pb_utils
        self._sender = sender
        self.channel_id = channel_id
        self._pending: list[Entry] = []
        self.closed = False

    def add(self, entry: Entry) -> bool:
        """Queue one output; True when the channel held nothing (the caller schedules a flush
        behind the outputs already queued for the sender thread)."""
        was_empty = not self._pending
        self._pending.append(entry)
        return was_empty

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
        self.closed = True
        self._sender.send(flags=self._pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def gone(self) -> bool:
        """The stream that opened it is gone (its client cancelled or disconnected)."""
        return self._sender.is_cancelled()
