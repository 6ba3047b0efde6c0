"""A channel's batches on the replica (replica/backend/channel.py) and the commands that open
and close one, with a stand-in for Triton's `pb_utils` (pure logic; the real stub is in
test_triton_e2e.py)."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from replica.backend.channel import Channel
from replica.backend.control_request import ChannelCommand, ControlRequest, parse_control
from replica.backend.response_stream import ResponseStream
from replica.engine.request import ErrorKind, FinishReason, RequestOutput
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
    # The acknowledgement says this replica takes submission batches too.
    assert _outputs(sender.sent[0][0]) == {"control_output": [b'{"channel": "open", "batches": true}']}
    assert json.loads(sender.sent[0][0].output_tensors[0].array[0]) == {"channel": "open",
                                                                        "batches": True}
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


def _sub_request(**options) -> tuple[Sender, Channel, ResponseStream, list]:
    """A sub-request of a submission batch (sender=None) on a channel of its own: the channel's
    sender, the channel, the stream and the flushes it scheduled."""
    channel_sender, flushes = Sender(), []
    channel = Channel(TensorPb, channel_sender, "ch")
    options.setdefault("stream", True)
    stream = ResponseStream(TensorPb, None, "a", on_cancel=lambda _: None, channel=channel,
                            schedule_flush=lambda: flushes.append(1), **options)
    return channel_sender, channel, stream, flushes


def test_a_sub_request_has_no_sender_its_outputs_go_to_the_channel_and_nothing_completes():
    """A sub-request of a submission batch (sender=None): entries only, no bare completion,
    never polled for cancellation."""
    channel_sender, channel, stream, flushes = _sub_request(poll_every=1)
    stream.poll_idle()  # nothing to poll: no sender
    for index in range(3):
        stream.on_output(_token("a", index, finished=index == 2))
    assert flushes == [1] and stream.closed
    channel.flush()
    ((batch, flags),) = channel_sender.sent  # the batch only: no completion anywhere
    assert flags == 0
    assert _entries(batch) == [["a", " w0", "", 5, 1, 2, False], ["a", " w1", "", 5, 2, 2, False],
                               ["a", " w2", "length", 5, 3, 2, True]]


def test_a_non_streamed_sub_request_sends_one_entry_with_the_whole_text():
    channel_sender, channel, stream, _ = _sub_request(stream=False, prompt_prefix="P:")
    for index in range(2):
        stream.on_output(_token("a", index, finished=index == 1))
    channel.flush()
    assert _entries(channel_sender.sent[0][0]) == [["a", "P: w0 w1", "length", 5, 2, 2, True]]


def test_a_sub_requests_error_output_is_one_entry_after_its_outputs():
    channel_sender, channel, stream, flushes = _sub_request()
    stream.on_output(_token("a", 0, finished=False))
    stream.on_output(RequestOutput("a", [], "", True, FinishReason.ABORT, 5, 1, 0,
                                   error="the model produced non-finite logits",
                                   error_kind=ErrorKind.INTERNAL))
    assert stream.closed
    stream.fail("request failed: again")  # closed: nothing more
    channel.flush()
    ((batch, _),) = channel_sender.sent
    assert _entries(batch) == [
        ["a", " w0", "", 5, 1, 2, False],
        ["a", "request failed: the model produced non-finite logits", "error", 0, 0, 0, True]]


def test_a_sub_requests_failure_after_a_flush_schedules_its_own():
    channel_sender, channel, stream, flushes = _sub_request()
    stream.on_output(_token("a", 0, finished=False))
    channel.flush()
    stream.fail("request failed: sending a response failed: RuntimeError('x')")
    assert flushes == [1, 1]
    channel.flush()
    assert _entries(channel_sender.sent[1][0]) == [
        ["a", "request failed: sending a response failed: RuntimeError('x')", "error", 0, 0, 0, True]]


def test_a_stream_needs_a_sender_or_a_channel():
    with pytest.raises(ValueError):
        ResponseStream(TensorPb, None, "a", stream=True, on_cancel=lambda _: None)


def test_the_channel_keeps_its_running_sub_requests_and_hands_them_over_once_stopped():
    channel = Channel(TensorPb, Sender(), "ch")
    assert channel.start("a") and channel.start("b") and channel.start("c")
    channel.end("b")
    channel.end("unknown")  # a lone request on the channel, or one already ended: a no-op
    assert channel.taking
    assert sorted(channel.stop_running()) == ["a", "c"]
    assert not channel.taking
    assert not channel.start("d")  # being closed: takes no more
    assert channel.stop_running() == []


class FreedAfterFinal(Sender):
    """Triton's response factory as the channel must treat it: freed once the final response
    is sent, so a cancellation check after that is a use after free (tritonserver died of
    SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled)."""

    def __init__(self):
        super().__init__()
        self.log: list[str] = []
        self.in_check = threading.Event()
        self.finish_check = threading.Event()
        self.block_checks = False

    def send(self, response=None, flags=0):
        super().send(response, flags)
        self.log.append("final" if flags else "batch")

    def is_cancelled(self):
        if any(flags for _, flags in self.sent):
            raise AssertionError("is_cancelled after the final response: a freed factory")
        self.log.append("check")
        if self.block_checks:
            self.in_check.set()
            self.finish_check.wait(10)
        self.log.append("checked")
        return False


def test_a_completed_channel_is_never_asked_whether_it_was_cancelled():
    sender = FreedAfterFinal()
    channel = Channel(TensorPb, sender, "ch")
    assert channel.gone() is False
    channel.close()
    assert channel.gone() is False  # without asking Triton about a freed request
    assert sender.log == ["check", "checked", "final"]


def test_the_watch_threads_check_and_the_final_response_never_overlap():
    """The watch thread is asking whether the channel's stream is gone when the sender thread
    closes it: the final response waits for the answer (else the factory could be freed under
    the check)."""
    sender = FreedAfterFinal()
    channel = Channel(TensorPb, sender, "ch")
    channel.add(("a", " w0", "", 5, 1, 0, False))  # close() flushes it first
    sender.block_checks = True
    watch = threading.Thread(target=channel.gone)
    watch.start()
    assert sender.in_check.wait(10)
    closer = threading.Thread(target=channel.close)
    closer.start()
    closer.join(0.5)  # it flushes, then waits for the check (bounded: it must not finish)
    assert closer.is_alive() and "final" not in sender.log
    sender.finish_check.set()
    watch.join(10)
    closer.join(10)
    assert sender.log == ["check", "batch", "checked", "final"]
