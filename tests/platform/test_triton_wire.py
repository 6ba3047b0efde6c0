"""inference.triton_client builds Triton's request messages itself: they must be the messages
tritonclient builds from InferInputs and numpy arrays (what the platform sent before), field
for field (pure logic: no server)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.grpc import InferInput
from tritonclient.grpc._utils import _get_inference_request

from inference.replica_client import ReplicaRequest
from inference.triton_messages import build_control_request, build_request


def _tensor(name: str, array: np.ndarray, datatype: str) -> InferInput:
    value = InferInput(name, list(array.shape), datatype)
    value.set_data_from_numpy(array)
    return value


def _text(value: str) -> np.ndarray:
    return np.array([value.encode("utf-8")], dtype=np.object_)


def tritonclients(request: ReplicaRequest):
    """The request as tritonclient builds it (the platform's former `build_inputs`)."""
    sampling = {"max_tokens": request.max_tokens, "temperature": request.temperature,
                "top_p": request.top_p, "stop": list(request.stop)}
    if request.seed is not None:
        sampling["seed"] = request.seed
    inputs = [
        _tensor("text_input", _text(request.prompt_text), "BYTES"),
        _tensor("stream", np.array([True], dtype=bool), "BOOL"),
        _tensor("sampling_parameters", _text(json.dumps(sampling)), "BYTES"),
        _tensor("exclude_input_in_output", np.array([True], dtype=bool), "BOOL"),
        _tensor("priority", np.array([request.priority], dtype=np.int32), "INT32"),
        _tensor("cache_salt", _text(request.cache_salt or request.tenant), "BYTES"),
        _tensor("tenant", _text(request.tenant), "BYTES"),
    ]
    if request.prompt_token_ids is not None:
        inputs.append(_tensor("input_ids", np.array(request.prompt_token_ids, dtype=np.int64),
                              "INT64"))
    return _get_inference_request(
        model_name=request.model_name, inputs=inputs, model_version="",
        request_id=request.request_id, outputs=None, sequence_id=0, sequence_start=False,
        sequence_end=False, priority=0, timeout=None, parameters=None)


def request(**changes) -> ReplicaRequest:
    fields = dict(request_id="req-1", model_name="chat-small", prompt_text="Hello there",
                  prompt_token_ids=(1, 2, 3), max_tokens=16, temperature=0.7, top_p=0.9,
                  seed=None, stop=(), priority=10, tenant="7", cache_salt="7")
    fields.update(changes)
    return ReplicaRequest(**fields)


@pytest.mark.parametrize("changes", [
    {},
    {"prompt_token_ids": None},
    {"prompt_token_ids": (0, 2**40, 49151, 7) * 300},
    {"seed": 1234, "stop": ("\n\n", "END")},
    {"prompt_text": "é 漢字 🙂 \x00 end", "tenant": "shared", "cache_salt": ""},
    {"priority": 0, "temperature": 0.0, "top_p": 1.0},
    {"priority": -3},
])
def test_the_same_message_as_tritonclients(changes):
    ours = build_request(request(**changes))
    theirs = tritonclients(request(**changes))
    assert ours == theirs
    assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(deterministic=True)


def test_a_usage_query_is_the_same_message_too():
    ours = build_control_request("chat-small", ["a", "b"], True, 1.5)
    control = json.dumps({"usage": ["a", "b"], "abort": True, "wait_s": 1.5})
    theirs = _get_inference_request(
        model_name="chat-small", inputs=[_tensor("control", _text(control), "BYTES")],
        model_version="", request_id="", outputs=None, sequence_id=0, sequence_start=False,
        sequence_end=False, priority=0, timeout=None, parameters=None)
    assert ours == theirs
