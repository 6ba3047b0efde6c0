"""Submission batches (replica/backend/submission_batch.py): the `batch` input's parsing, and
the model's execute path for a batch (model.py with a stand-in `triton_python_backend_utils`,
a stand-in engine loop and a sender executor run by hand: pure logic; the real stub is in
test_triton_e2e.py)."""
from __future__ import annotations

import importlib.util
import json
import sys
import threading
import types

import numpy as np
import pytest

from replica.backend import error_messages
from replica.backend.generate_request import GenerateRequest
from replica.backend.submission_batch import MAX_BATCH, SubRequest, parse_batch
from replica.backend.usage_ledger import UsageLedger
from replica.engine.engine_loop import EngineUnavailableError
from replica.engine.request import FinishReason, RequestOutput
from replica.engine.sampling_params import InvalidRequestError
from replica.repository_writer import TEMPLATE_DIR
from tests.replica.test_channel import Sender
from tests.replica.test_error_reporting import TensorPb


def _batch(entries) -> np.ndarray:
    return np.array([json.dumps(entries).encode()], dtype=np.object_)


def _sub(sub_id="r1", channel="ch", **keys) -> dict:
    return {"id": sub_id, "channel": channel, **keys}


# ---- parsing ---------------------------------------------------------------------------------

def test_a_valid_batch_becomes_the_inputs_a_lone_request_would_carry():
    full = _sub("r1", "ch-1", text_input="héllo", stream=False, exclude_input_in_output=True,
                sampling_parameters=json.dumps({"max_tokens": 3, "temperature": 0}),
                priority=-2, cache_salt="salt", tenant="t-a", input_ids=[5, 6, 7])
    subs = parse_batch(_batch([full, _sub("r2", "ch-2", text_input="hi")]))
    assert [(sub.id, sub.channel) for sub in subs] == [("r1", "ch-1"), ("r2", "ch-2")]
    inputs = subs[0].inputs
    assert inputs["text_input"].dtype == np.object_ and inputs["stream"].dtype == np.bool_
    assert inputs["priority"].dtype == np.int32 and inputs["input_ids"].dtype == np.int64
    request = GenerateRequest.from_inputs(inputs)
    assert (request.text, request.prompt_token_ids, request.stream, request.prepend_prompt) == (
        "héllo", (5, 6, 7), False, False)
    assert request.params.max_tokens == 3 and request.params.greedy
    assert (request.priority, request.cache_salt, request.tenant, request.channel) == (
        -2, "salt", "t-a", "ch-1")
    minimal = GenerateRequest.from_inputs(subs[1].inputs)  # left out: not sent, the defaults
    assert minimal == GenerateRequest.from_inputs({"text_input": np.array([b"hi"], dtype=np.object_),
                                                   "channel": np.array([b"ch-2"], dtype=np.object_)})
    assert minimal.stream and not minimal.prepend_prompt and minimal.params.max_tokens == 16


def test_a_batch_of_the_most_requests_is_read_and_an_empty_one_is_nothing():
    assert len(parse_batch(_batch([_sub(f"r{i}", text_input="x") for i in range(MAX_BATCH)]))) == MAX_BATCH
    assert parse_batch(_batch([])) == []


@pytest.mark.parametrize("array, needle", [
    (np.array([b"{oops"], dtype=np.object_), "not valid JSON"),
    (np.array([b"[" * 100_000], dtype=np.object_), "not valid JSON"),
    (np.array([b"\xff\xfe"], dtype=np.object_), "not valid UTF-8"),
    (np.array([b"[]", b"[]"], dtype=np.object_), "exactly one element"),
    (_batch({"id": "r1", "channel": "ch"}), "JSON list"),
    (_batch([_sub(), 3]), "batch[1] must be a JSON object"),
    (_batch([{"channel": "ch", "text_input": "x"}]), "batch[0].id"),
    (_batch([_sub(""), ]), "batch[0].id"),
    (_batch([_sub("r" * 129)]), "batch[0].id"),
    (_batch([_sub(7)]), "batch[0].id"),
    (_batch([{"id": "r1", "text_input": "x"}]), "batch[0].channel"),
    (_batch([_sub(channel="")]), "batch[0].channel"),
    (_batch([_sub(channel="c" * 129)]), "batch[0].channel"),
    (_batch([_sub(channel=["ch"])]), "batch[0].channel"),
    (_batch([_sub(f"r{i}", text_input="x") for i in range(MAX_BATCH + 1)]), "more than 256"),
])
def test_a_batch_malformed_as_a_whole_is_refused_whole(array, needle):
    with pytest.raises(InvalidRequestError) as info:
        parse_batch(array)
    assert needle in str(info.value)


@pytest.mark.parametrize("keys, needle", [
    ({"text_input": 5}, "text_input must be a string (BYTES)"),
    ({"text_input": None}, "text_input must be a string (BYTES)"),
    ({"text_input": "bad \ud800"}, "text_input is not valid UTF-8"),
    ({"text_input": "x", "sampling_parameters": {"max_tokens": 3}}, "sampling_parameters must be a string"),
    ({"text_input": "x", "stream": "yes"}, "stream must be BOOL"),
    ({"text_input": "x", "exclude_input_in_output": 1}, "exclude_input_in_output must be BOOL"),
    ({"text_input": "x", "priority": "1"}, "priority must be an integer"),
    ({"text_input": "x", "priority": True}, "priority must be an integer"),
    ({"text_input": "x", "priority": 2**40}, "INT32"),
    ({"input_ids": [1.5]}, "INT64"),
    ({"input_ids": [True]}, "INT64"),
    ({"input_ids": "1,2"}, "INT64"),
    ({"input_ids": [2**70]}, "INT64"),
    ({"text_input": "x", "tenant": 3}, "tenant must be a string"),
    ({"text_input": "x", "prompt": "y"}, "unknown keys"),
])
def test_a_bad_sub_request_carries_its_own_error_and_its_neighbours_go_on(keys, needle):
    subs = parse_batch(_batch([_sub("ok1", text_input="a"), _sub("bad", **keys),
                               _sub("ok2", text_input="b")]))
    assert [sub.id for sub in subs] == ["ok1", "bad", "ok2"]
    assert isinstance(subs[1].inputs, InvalidRequestError) and needle in str(subs[1].inputs)
    assert [GenerateRequest.from_inputs(subs[i].inputs).text for i in (0, 2)] == ["a", "b"]


def test_a_sub_request_gets_every_check_a_lone_request_gets():
    """Checks that need more than the JSON types are from_inputs' own, with its messages."""
    for keys, needle in (({}, "text_input is required"), ({"text_input": ""}, "text_input is empty"),
                         ({"text_input": "x", "sampling_parameters": "{oops"}, "not valid JSON"),
                         ({"text_input": "x", "sampling_parameters": '{"top_p": 2}'}, "top_p")):
        (sub,) = parse_batch(_batch([_sub(**keys)]))
        with pytest.raises(InvalidRequestError) as info:
            GenerateRequest.from_inputs(sub.inputs)
        assert needle in str(info.value)


# ---- the model's execute path -------------------------------------------------------------------

class Request:
    """A Triton request: its input tensors by name, its id and its sender."""

    def __init__(self, inputs: dict, request_id: str = ""):
        self.inputs, self.id, self.sender = inputs, request_id, Sender()

    def get_response_sender(self):
        return self.sender

    def request_id(self):
        return self.id


class InputTensor:
    def __init__(self, array):
        self.array = array

    def as_numpy(self):
        return self.array


def _stub_module() -> types.ModuleType:
    pb = types.ModuleType("triton_python_backend_utils")
    pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = TensorPb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    pb.TritonError, pb.InferenceResponse, pb.Tensor = (
        TensorPb.TritonError, TensorPb.InferenceResponse, TensorPb.Tensor)

    def get_input_tensor_by_name(request, name):
        array = request.inputs.get(name)
        return None if array is None else InputTensor(array)

    pb.get_input_tensor_by_name = get_input_tensor_by_name
    return pb


class Executor:
    """The model's sender executor, run by hand (`run`: every task, in order)."""

    def __init__(self):
        self.tasks = []

    def submit(self, fn, *args):
        self.tasks.append((fn, args))

    def run(self):
        while self.tasks:
            fn, args = self.tasks.pop(0)
            fn(*args)


class Loop:
    """The engine loop: records submits and aborts; `refuse` makes submit raise,
    `during_submit` runs inside submit, before the request is held."""

    def __init__(self):
        self.submitted, self.aborted, self.callbacks = [], [], {}
        self.refuse = None
        self.during_submit = None

    def submit(self, request_id, prompt_token_ids, params, priority=0, tenant="", cache_salt="",
               *, on_output):
        if self.refuse is not None:
            raise self.refuse
        if not prompt_token_ids:
            raise InvalidRequestError("the prompt is empty")
        if self.during_submit is not None:
            self.during_submit()
        self.submitted.append((request_id, prompt_token_ids, priority, tenant, cache_salt))
        self.callbacks[request_id] = on_output

    def abort(self, request_id):  # as EngineLoop.abort: a no-op for a request it does not hold
        if request_id in self.callbacks:
            self.aborted.append(request_id)


class Tokenizer:
    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class VllmMetrics:
    def __init__(self):
        self.arrived_ids, self.forgotten = [], []

    def arrived(self, request_id):
        self.arrived_ids.append(request_id)

    def output(self, request_id, num_output_tokens, finished):
        pass

    def forget(self, request_id):
        self.forgotten.append(request_id)


@pytest.fixture
def model(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _stub_module())
    spec = importlib.util.spec_from_file_location("smollm2_model_under_test",
                                                  TEMPLATE_DIR / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel.__new__(module.TritonPythonModel)  # no engine: initialize's
    model._engine = None  # state, by hand (check_prompt is not reached: every sub has its text)
    model._tokenizer = Tokenizer()
    model._streams, model._streams_lock, model._channels = {}, threading.Lock(), {}
    model._sender, model._loop = Executor(), Loop()
    model._ledger, model._vllm_metrics = UsageLedger(), VllmMetrics()
    return model


def _open_channel(model, channel_id="ch") -> Sender:
    request = Request({"control": np.array(
        [json.dumps({"channel": channel_id, "open": True}).encode()], dtype=np.object_)})
    model.execute([request])
    model._sender.run()
    assert len(request.sender.sent) == 1  # the acknowledgement
    return request.sender


def _entries(sender: Sender) -> list:
    """Every channel entry the channel's sender sent, in order."""
    entries = []
    for response, flags in sender.sent:
        if response is not None and response.output_tensors[0].name == "channel_output":
            entries += json.loads(response.output_tensors[0].array[0])
    return entries


FINAL = TensorPb.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def test_a_batch_submits_its_valid_request_sends_the_invalid_ones_error_and_completes(model):
    channel_sender = _open_channel(model)
    batch = Request({"batch": _batch([
        _sub("ok", text_input="hey", priority=3, tenant="t", cache_salt="s"),
        _sub("bad", text_input="x", stream="yes")])}, request_id="batch-1")
    model.execute([batch])
    assert batch.sender.sent == [(None, FINAL)]  # completed at once: nothing reaches the client
    assert model._loop.submitted == [("ok", [104, 101, 121], 3, "t", "s")]
    assert model._ledger.lookup(["ok", "bad"])["ok"].state != "unknown"
    assert model._ledger.lookup(["bad"])["bad"].state == "unknown"
    assert model._vllm_metrics.arrived_ids == ["ok"]
    model._sender.run()  # the error goes out through the sender thread
    assert _entries(channel_sender) == [
        ["bad", f"{error_messages.INVALID_REQUEST} stream must be BOOL", "error", 0, 0, 0, True]]
    (channel,) = model._channels.values()
    assert channel.stop_running() == ["ok"]


def test_a_sub_requests_outputs_go_to_its_channel_and_end_it_without_a_completion(model):
    channel_sender = _open_channel(model)
    batch = Request({"batch": _batch([_sub("a", text_input="hi")])})
    model.execute([batch])
    on_output = model._loop.callbacks["a"]
    on_output(RequestOutput("a", [1], " w0", False, None, 2, 1, 0))
    on_output(RequestOutput("a", [2], " w1", True, FinishReason.LENGTH, 2, 2, 0))
    model._sender.run()
    assert _entries(channel_sender) == [["a", " w0", "", 2, 1, 0, False],
                                        ["a", " w1", "length", 2, 2, 0, True]]
    assert all(response is not None for response, _ in channel_sender.sent)  # no bare completion
    assert batch.sender.sent == [(None, FINAL)]
    assert model._ledger.lookup(["a"])["a"].state == "finished"
    assert "a" not in model._streams and model._vllm_metrics.forgotten == ["a"]
    (channel,) = model._channels.values()
    assert channel.stop_running() == []  # it no longer runs


def test_a_batch_malformed_as_a_whole_gets_an_error_response_on_its_own_sender(model):
    _open_channel(model)
    batch = Request({"batch": np.array([b"{oops"], dtype=np.object_)})
    model.execute([batch])
    ((response, flags),) = batch.sender.sent
    assert flags == FINAL and response.error.code == "INVALID_ARG"
    assert response.error.message == f"{error_messages.INVALID_REQUEST} batch is not valid JSON"
    assert model._loop.submitted == []


def test_a_sub_request_naming_no_open_channel_is_dropped(model, caplog):
    channel_sender = _open_channel(model, "ch")
    batch = Request({"batch": _batch([_sub("lost", "nowhere", text_input="x"),
                                      _sub("kept", "ch", text_input="x")])})
    model.execute([batch])
    model._sender.run()
    assert [submitted[0] for submitted in model._loop.submitted] == ["kept"]
    assert "no open channel nowhere; dropped" in caplog.text
    assert _entries(channel_sender) == [] and batch.sender.sent == [(None, FINAL)]
    assert model._ledger.lookup(["lost"])["lost"].state == "unknown"


def test_refused_sub_requests_get_the_prefix_of_their_refusal(model):
    channel_sender = _open_channel(model)
    model._loop.refuse = EngineUnavailableError("the replica is draining and takes no new requests")
    model.execute([Request({"batch": _batch([_sub("a", text_input="x")])})])
    model._loop.refuse = RuntimeError("boom")
    model.execute([Request({"batch": _batch([_sub("b", text_input="x")])})])
    model._loop.refuse = None
    model.execute([Request({"batch": _batch([_sub("c", text_input="")])})])
    model._sender.run()
    assert [entry[:3] for entry in _entries(channel_sender)] == [
        ["a", f"{error_messages.UNAVAILABLE} the replica is draining and takes no new requests", "error"],
        ["b", f"{error_messages.REQUEST_FAILED} RuntimeError('boom')", "error"],
        ["c", f"{error_messages.INVALID_REQUEST} text_input is empty", "error"]]
    assert all(model._ledger.lookup([rid])[rid].state == "unknown" for rid in "abc")
    assert model._streams == {}


def test_a_channel_whose_stream_is_gone_aborts_its_running_sub_requests(model):
    _open_channel(model)
    model.execute([Request({"batch": _batch([_sub("a", text_input="x"), _sub("b", text_input="y")])})])
    model._loop.callbacks["a"](RequestOutput("a", [], "", True, FinishReason.LENGTH, 1, 1, 0))
    model._sender.run()  # "a" is done: only "b" still runs
    channel = model._channels.pop("ch")  # as the watch thread does
    model._close_gone(channel)
    assert model._loop.aborted == ["b"] and channel.closed
    # A sub-request naming it now has nowhere to go.
    model.execute([Request({"batch": _batch([_sub("c", text_input="x")])})])
    assert [submitted[0] for submitted in model._loop.submitted] == ["a", "b"]


def test_closing_a_channel_by_command_aborts_its_running_sub_requests(model):
    _open_channel(model)
    model.execute([Request({"batch": _batch([_sub("a", text_input="x")])})])
    close = Request({"control": np.array([b'{"channel": "ch", "close": true}'], dtype=np.object_)})
    model.execute([close])
    model._sender.run()
    assert model._loop.aborted == ["a"]
    assert close.sender.sent[-1][1] == FINAL


def test_a_sub_request_submitted_while_its_channel_closes_is_aborted_by_its_submitter(model):
    _open_channel(model)
    channel = model._channels["ch"]

    def close_meanwhile():  # stop_running runs between the sub-request's start and its submit
        model._channels.pop("ch")
        model._close_channel(channel)

    model._loop.during_submit = close_meanwhile
    model.execute([Request({"batch": _batch([_sub("a", text_input="x")])})])
    assert [submitted[0] for submitted in model._loop.submitted] == ["a"]
    assert model._loop.aborted == ["a"]
