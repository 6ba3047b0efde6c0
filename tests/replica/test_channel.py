"""A channel's batches on the replica (replica/backend/channel.py) and the commands that open
and close one, with a stand-in for Triton's `pb_utils` (pure logic; the real stub is in
test_triton_e2e.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from replica.backend.channel import Channel
from replica.backend.control_request import ChannelCommand, ControlRequest, parse_control
from replica.backend.response_stream import ResponseStream
from replica.engine.request import FinishReason, RequestOutput
from replica.engine.sampling_params import InvalidRequestError
from tests.replica.test_error_reporting import TensorPb


class Sender:
    def __init__(self):
        self.sent = []  # (response or None, flags)

    def send(self, response=None, flags=0):
        self.sent.append((response, flags))

    def is_cancelled(self):
        return False


def _outputs(response) -> dict:
    return {t.name: list(t.array) for t in response.output_tensors}


def _entries(response) -> list:
    """A batch's entries (its one `channel_output` element, a JSON list)."""
    (tensor,) = response.output_tensors
    assert tensor.name == "channel_output" and len(tensor.array) == 1
    return json.loads(tensor.array[0])


def _token(request_id: str, index: int, finished: bool) -> RequestOutput:
    return RequestOutput(request_id, [index], f" w{index}", finished,
                         FinishReason.LENGTH if finished else None, 5, index + 1, 2)


def test_outputs_of_several_requests_leave_in_one_batch_then_each_request_completes():
    channel_sender, flushes = Sender(), []
    channel = Channel(TensorPb, channel_sender, "ch")
    senders = {rid: Sender() for rid in ("a", "b")}
    streams = {rid: ResponseStream(TensorPb, senders[rid], rid, stream=True,
                                   on_cancel=lambda _: None, channel=channel,
                                   schedule_flush=lambda: flushes.append(1))
               for rid in ("a", "b")}
    for index in range(2):
        for rid in ("a", "b"):
            streams[rid].on_output(_token(rid, index, finished=index == 1))
    assert flushes == [1]  # one flush scheduled for the four outputs
    channel.flush()
    ((batch, flags),) = channel_sender.sent
    assert flags == 0
    assert _entries(batch) == [["a", " w0", "", 5, 1, 2, False], ["b", " w0", "", 5, 1, 2, False],
                               ["a", " w1", "length", 5, 2, 2, True],
                               ["b", " w1", "length", 5, 2, 2, True]]
    # Each request's own sender only completes it (a bare final flag, nothing to the client).
    for sender in senders.values():
        assert sender.sent == [(None, TensorPb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)]
    assert all(stream.closed for stream in streams.values())


def test_an_error_goes_out_after_the_outputs_before_it():
    channel_sender = Sender()
    channel = Channel(TensorPb, channel_sender, "ch")
    own = Sender()
    stream = ResponseStream(TensorPb, own, "a", stream=True, on_cancel=lambda _: None,
                            channel=channel, schedule_flush=lambda: None)
    stream.on_output(_token("a", 0, finished=False))
    stream.fail("request failed: boom")
    assert [entry[1] for entry in _entries(channel_sender.sent[0][0])] == [" w0"]
    ((error, flags),) = own.sent
    assert error.error.message == "request failed: boom"
    assert flags == TensorPb.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def test_closing_flushes_then_completes_and_a_closed_channel_sends_nothing():
    sender = Sender()
    channel = Channel(TensorPb, sender, "ch")
    channel.acknowledge()
    assert _outputs(sender.sent[0][0]) == {"control_output": [b'{"channel": "open"}']}
    assert channel.add(("a", " x", "", 1, 1, 0, False))
    assert not channel.add(("a", " y", "", 1, 2, 0, False))
    channel.close()
    assert [entry[1] for entry in _entries(sender.sent[1][0])] == [" x", " y"]
    assert sender.sent[2] == (None, TensorPb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    channel.add(("a", " z", "", 1, 3, 0, False))
    channel.flush()
    channel.close()
    assert len(sender.sent) == 3


def _control(data) -> np.ndarray:
    return np.array([json.dumps(data).encode()], dtype=np.object_)


def test_channel_commands_and_usage_queries_are_told_apart():
    assert parse_control(_control({"channel": "c1", "open": True})) == ChannelCommand("c1", True)
    assert parse_control(_control({"channel": "c1", "close": True})) == ChannelCommand("c1", False)
    assert isinstance(parse_control(_control({"usage": ["a"]})), ControlRequest)
    for bad in ({"channel": "", "open": True}, {"channel": "c" * 129, "open": True},
                {"channel": "c", "open": True, "close": True}, {"channel": "c"},
                {"channel": "c", "open": True, "usage": []}, {"channel": 3, "open": True}):
        with pytest.raises(InvalidRequestError):
            parse_control(_control(bad))


def test_a_text_that_is_not_utf8_does_not_lose_the_batch():
    sender = Sender()
    channel = Channel(TensorPb, sender, "ch")
    channel.add(("a", "ok", "", 1, 1, 0, False))
    channel.add(("b", "bad \ud800 half", "", 1, 1, 0, False))
    channel.flush()
    assert [entry[1] for entry in _entries(sender.sent[0][0])] == ["ok", "bad ? half"]


def test_a_batch_the_stream_refuses_is_logged_not_raised(caplog):
    class Gone(Sender):
        def send(self, response=None, flags=0):
            raise RuntimeError("stream gone")

    channel = Channel(TensorPb, Gone(), "ch")
    channel.add(("a", "x", "", 1, 1, 0, False))
    channel.flush()
    assert "could not be sent" in caplog.text
