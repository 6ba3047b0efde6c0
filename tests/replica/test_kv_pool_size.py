"""The KV pool sized in blocks (`kv_cache_blocks`, `replica.launch --kv-cache-blocks`) holds
that many blocks whatever the dtype; sized in bytes, float32 buys half the blocks bfloat16 does
(what made `benchmarks.routing`'s pools differ between machines: round frontdoor11)."""
import pytest

from replica.launch import parse_args, spec_from_args
from tests.replica.tiny_llama import TINY, hf_model, our_engine


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_pool_sized_in_blocks_holds_them_in_either_dtype(dtype):
    state = hf_model(TINY).state_dict()
    assert our_engine(TINY, state, dtype=dtype, kv_cache_blocks=7).stats().num_total_blocks == 7


def test_a_pool_sized_in_bytes_holds_half_the_blocks_in_float32():
    state = hf_model(TINY).state_dict()
    blocks = {dtype: our_engine(TINY, state, dtype=dtype, kv_cache_bytes=1 << 20).stats().num_total_blocks
              for dtype in ("float32", "bfloat16")}
    assert blocks["bfloat16"] == 2 * blocks["float32"] > 0


def test_too_small_a_pool_in_blocks_is_refused():
    with pytest.raises(ValueError, match="--kv-cache-blocks 1"):
        our_engine(TINY, hf_model(TINY).state_dict(), kv_cache_blocks=1)


def test_the_launcher_passes_the_blocks_to_the_model_parameters():
    ports = ["--grpc-port", "1", "--http-port", "2", "--metrics-port", "3"]
    spec = spec_from_args(parse_args(["--model", "m", "--kv-cache-blocks", "200", *ports]), env={})
    assert spec.parameters.kv_cache_blocks == 200
    assert spec.parameters.engine_config("/w").kv_cache_blocks == 200
    assert spec_from_args(parse_args(["--model", "m", *ports]), env={}).parameters.kv_cache_blocks == 0
    with pytest.raises(SystemExit):
        parse_args(["--model", "m", "--kv-cache-blocks", "1", *ports])
