"""inference.triton_client.parse_chunk: a streamed response's outputs read from the raw bytes,
without numpy (pure logic: responses built as the fake Triton server builds them)."""
from types import SimpleNamespace

import pytest
from tritonclient.grpc import InferResult

from inference.triton_client import parse_chunk
from tests.fakes.triton_server import encode_response


@pytest.mark.parametrize("text, finish, num_in, num_out, final", [
    ("Hello", "", 12, 1, False),
    ("", "length", 150, 64, True),
    ("é 漢字 🙂", "stop", 7, 2**31 - 1, True),
])
def test_chunks_parse_as_numpy_reads_them(text, finish, num_in, num_out, final):
    """parse_chunk reads the one-element outputs from the raw bytes, without numpy: the same
    values tritonclient's as_numpy gives."""
    response = encode_response(SimpleNamespace(model_name="m", id="r"), text, finish, num_in,
                               num_out, final).infer_response
    result = InferResult(response)
    chunk = parse_chunk(response)
    assert chunk.text == result.as_numpy("text_output")[0].decode() == text
    assert chunk.finish_reason == finish
    assert chunk.num_input_tokens == int(result.as_numpy("num_input_tokens")[0]) == num_in
    assert chunk.num_output_tokens == num_out
    assert chunk.num_cached_tokens == 0
    assert chunk.final is bool(result.as_numpy("final")[0]) is final
