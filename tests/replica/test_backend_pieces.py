"""Pure parts of the Triton model: input validation, config parameters, repository writing."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from replica.backend.generate_request import GenerateRequest
from replica.backend.model_parameters import ModelParameters
from replica.engine.sampling_params import InvalidRequestError
from replica.repository_writer import TEMPLATE_DIR, write_model_repository


def text(value: str) -> np.ndarray:
    return np.array([value.encode()], dtype=np.object_)


def params(**kwargs) -> np.ndarray:
    return text(json.dumps(kwargs))


def test_defaults_mirror_the_vllm_backend():
    streamed = GenerateRequest.from_inputs({"text_input": text("héllo")})
    assert streamed.text == "héllo" and streamed.stream and not streamed.prepend_prompt
    assert streamed.params.max_tokens == 16 and streamed.prompt_token_ids is None
    whole = GenerateRequest.from_inputs({"text_input": text("hi"), "stream": np.array([False])})
    assert not whole.stream and whole.prepend_prompt  # non-streaming includes the prompt by default
    explicit = GenerateRequest.from_inputs(
        {"text_input": text("hi"), "exclude_input_in_output": np.array([False])}
    )
    assert explicit.stream and explicit.prepend_prompt


def test_optional_inputs():
    request = GenerateRequest.from_inputs({
        "input_ids": np.array([5, 6, 7], dtype=np.int64),
        "sampling_parameters": params(max_tokens=3, temperature=0, stop=["\n"]),
        "priority": np.array([-2], dtype=np.int32),
        "cache_salt": text("tenant-a"),
        "tenant": text("a"),
        "channel": text("channel-1-0"),
    })
    assert request.prompt_token_ids == (5, 6, 7) and request.text == ""
    assert request.channel == "channel-1-0"
    assert request.params.max_tokens == 3 and request.params.greedy and request.params.stop == ("\n",)
    assert (request.priority, request.cache_salt, request.tenant) == (-2, "tenant-a", "a")


@pytest.mark.parametrize("inputs, needle", [
    ({}, "text_input is required"),
    ({"text_input": text("")}, "text_input is empty"),
    ({"text_input": np.array([b"\xff\xfe"], dtype=np.object_)}, "not valid UTF-8"),
    ({"text_input": np.array([b"a", b"b"], dtype=np.object_)}, "exactly one element"),
    ({"text_input": text("x"), "sampling_parameters": text("{oops")}, "not valid JSON"),
    ({"text_input": text("x"), "sampling_parameters": text("[1]")}, "JSON object"),
    ({"text_input": text("x"), "sampling_parameters": params(top_p=2)}, "top_p"),
    ({"text_input": text("x"), "sampling_parameters": params(n=2)}, "unknown sampling parameters"),
    ({"text_input": text("x"), "sampling_parameters": params(max_tokens="many")}, "bad sampling parameter"),
    ({"text_input": text("x"), "stream": np.array([1], dtype=np.int32)}, "stream must be BOOL"),
    ({"input_ids": np.array([1.5])}, "INT64"),
    ({"text_input": text("x"), "priority": np.array([2**40], dtype=np.int64)}, "INT32"),
    ({"text_input": text("x"), "channel": text("c" * 129)}, "channel is longer"),
])
def test_invalid_inputs_name_the_problem(inputs, needle):
    with pytest.raises(InvalidRequestError) as info:
        GenerateRequest.from_inputs(inputs)
    assert needle in str(info.value)


def test_parameters_round_trip_through_config_pbtxt(tmp_path):
    parameters = ModelParameters(weights='/w/"x".gguf', dtype="float32", device="cuda", quantization="int8", kv_cache_bytes=123, kv_cache_blocks=9, max_num_seqs=4,
                                 max_num_batched_tokens=64, num_threads=1, drain_file="/d", drain_grace_s=2.5)
    write_model_repository(tmp_path, "my-model", parameters)
    config_text = (tmp_path / "my-model" / "config.pbtxt").read_text()
    assert 'name: "my-model"' in config_text and 'decoupled: true' in config_text
    assert (tmp_path / "my-model" / "1" / "model.py").read_bytes() == (TEMPLATE_DIR / "1" / "model.py").read_bytes()
    # What Triton hands to initialize(): parameters as {"key": {"string_value": "..."}}.
    parsed = {}
    for key, value in re.findall(r'key: "(\w+)" value: \{ string_value: "((?:[^"\\]|\\.)*)" \}', config_text):
        parsed[key] = {"string_value": value.replace('\\"', '"').replace("\\\\", "\\")}
    assert ModelParameters.from_model_config({"parameters": parsed}) == parameters
    engine_config = parameters.engine_config(default_weights="/default")
    assert (engine_config.model_path, engine_config.num_threads, engine_config.kv_cache_bytes,
            engine_config.kv_cache_blocks) == ('/w/"x".gguf', 1, 123, 9)
    assert ModelParameters(weights="").engine_config(default_weights="/default").model_path == "/default"


def test_model_names_are_checked(tmp_path):
    with pytest.raises(ValueError):
        write_model_repository(tmp_path, "../escape", ModelParameters())
