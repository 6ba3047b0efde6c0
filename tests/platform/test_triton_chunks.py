"""inference.triton_messages.parse_chunk: a streamed response's outputs read from the raw bytes,
without numpy (pure logic: responses built as the fake Triton server builds them)."""
from types import SimpleNamespace

import pytest
from tritonclient.grpc import InferResult

from inference.triton_messages import parse_chunk
from tests.fakes.triton_server import LEAN_OUTPUTS, encode_response


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


def test_a_response_between_the_first_and_the_last_keeps_the_prompt_counts_of_the_one_before():
    """The replica's responses between a request's first and last carry only the text, the
    output count and `final`: the chunk keeps the prompt's counts of the chunk before it."""
    request = SimpleNamespace(model_name="m", id="r")
    first = parse_chunk(encode_response(request, "a", "", 12, 1, False).infer_response)
    lean = encode_response(request, "b", "", 12, 2, False, lean=True).infer_response
    assert {output.name for output in lean.outputs} == set(LEAN_OUTPUTS)
    second = parse_chunk(lean, first)
    assert (second.text, second.finish_reason, second.final) == ("b", "", False)
    assert (second.num_input_tokens, second.num_output_tokens) == (12, 2)
    assert second.num_cached_tokens == first.num_cached_tokens == 0
    last = parse_chunk(encode_response(request, "", "length", 12, 3, True).infer_response, second)
    assert (last.finish_reason, last.final, last.num_output_tokens) == ("length", True, 3)
