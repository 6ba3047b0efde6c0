"""How a request's error leaves the replica: the kind picks the Triton code and the message's
prefix (the platform's contract, replica/backend/error_messages.py). A stand-in for Triton's
`pb_utils` records what would be sent (pure logic; the real stub is in test_triton_e2e.py)."""
from __future__ import annotations

import threading

import pytest

from replica.backend import error_messages
from replica.backend.fault_trigger import FaultTrigger
from replica.backend.response_stream import ResponseStream
from replica.engine.request import ErrorKind, FinishReason, RequestOutput


class FakePb:
    TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

    class TritonError:
        INTERNAL, INVALID_ARG, UNAVAILABLE = "INTERNAL", "INVALID_ARG", "UNAVAILABLE"

        def __init__(self, message, code="UNKNOWN"):
            self.message, self.code = message, code

    class InferenceResponse:
        def __init__(self, output_tensors, error=None):
            self.output_tensors, self.error = output_tensors, error


class FakeSender:
    def __init__(self):
        self.sent = []

    def send(self, response, flags=0):
        self.sent.append((response, flags))

    def is_cancelled(self):
        return False


def _error_output(kind: ErrorKind | None, message: str) -> RequestOutput:
    return RequestOutput("r", [], "", True, FinishReason.ABORT, 3, 1, 0, error=message, error_kind=kind)


@pytest.mark.parametrize("kind, message, code, prefix", [
    (ErrorKind.INVALID_INPUT, "invalid request: top_p must be in (0, 1]", "INVALID_ARG", error_messages.INVALID_REQUEST),
    (ErrorKind.INTERNAL, "request failed: the model produced non-finite logits", "INTERNAL",
     error_messages.REQUEST_FAILED),
    (ErrorKind.ENGINE_DEAD, "engine failed: RuntimeError('x')", "UNAVAILABLE", error_messages.ENGINE_FAILED),
    (None, "something odd", "INTERNAL", error_messages.REQUEST_FAILED),
])
def test_each_error_kind_gets_its_code_and_prefix_once(kind, message, code, prefix):
    sender = FakeSender()
    stream = ResponseStream(FakePb, sender, "r", stream=True, on_cancel=lambda _: None)
    stream.on_output(_error_output(kind, message))
    ((response, flags),) = sender.sent
    assert flags == FakePb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    assert response.error.code == code
    assert response.error.message.startswith(prefix) and response.error.message.count(prefix) == 1
    assert stream.closed


def test_the_fault_trigger_fires_once_with_the_files_text(tmp_path):
    path = tmp_path / "fault"
    fired: list[str] = []
    done = threading.Event()
    trigger = FaultTrigger(str(path), lambda m: (fired.append(m), done.set()), poll_interval_s=0.01)
    trigger.start()
    path.write_text("chaos monkey\n")
    assert done.wait(5.0)
    trigger.stop()
    assert fired == ["chaos monkey"]


class FakeFamily:
    GAUGE, COUNTER = "gauge", "counter"
    metrics: list = []

    def __init__(self, name, description, kind):
        self.name = name

    def Metric(self, labels):  # noqa: N802 - pb_utils' name
        metric = FakeMetric(self.name)
        FakeFamily.metrics.append(metric)
        return metric


class FakeMetric:
    def __init__(self, name):
        self.name, self.value = name, 0.0

    def set(self, value):
        self.value = value

    def increment(self, value):
        self.value += value


def test_the_engine_alive_gauge_is_1_until_the_engine_dies():
    from replica.backend.engine_metrics import EngineMetrics
    from replica.metric_names import ENGINE_ALIVE

    pb = type("Pb", (), {"MetricFamily": FakeFamily})
    FakeFamily.metrics = []
    metrics = EngineMetrics(pb, {"model": "m", "version": "1"}, {"dtype": "float32", "quantization": "none"})
    (alive,) = [m for m in FakeFamily.metrics if m.name == ENGINE_ALIVE]
    assert alive.value == 1.0
    metrics.set_alive(False)
    assert alive.value == 0.0
    metrics.close()
    metrics.set_alive(True)  # after close: a no-op, never a crash


class TensorPb(FakePb):
    class Tensor:
        def __init__(self, name, array):
            self.name, self.array = name, array


def _token_output(index: int, finished: bool) -> RequestOutput:
    return RequestOutput("r", [index], f" w{index}", finished,
                         FinishReason.LENGTH if finished else None, 5, index + 1, 2)


def test_only_the_first_and_the_last_response_carry_every_output():
    """Between the first and the last response only what changes per token is built and sent
    (`text_output`, `num_output_tokens`, `final`); the prompt's counts come once, then at the end."""
    sender = FakeSender()
    stream = ResponseStream(TensorPb, sender, "r", stream=True, on_cancel=lambda _: None)
    for index in range(4):
        stream.on_output(_token_output(index, finished=index == 3))
    sent = [{t.name: t.array[0] for t in response.output_tensors} for response, _ in sender.sent]
    everything = {"text_output", "finish_reason", "num_input_tokens", "num_output_tokens",
                  "num_cached_tokens", "final"}
    assert [set(outputs) for outputs in sent] == [
        everything, {"text_output", "num_output_tokens", "final"},
        {"text_output", "num_output_tokens", "final"}, everything]
    assert [outputs["num_output_tokens"] for outputs in sent] == [1, 2, 3, 4]
    assert (sent[0]["num_input_tokens"], sent[0]["num_cached_tokens"]) == (5, 2)
    assert [bool(outputs["final"]) for outputs in sent] == [False, False, False, True]
    assert sent[-1]["finish_reason"] == b"length"
    assert [flags for _, flags in sender.sent] == [0, 0, 0, FakePb.TRITONSERVER_RESPONSE_COMPLETE_FINAL]
