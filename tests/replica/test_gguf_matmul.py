"""The GGUF-block matrix product (csrc/gguf_matmul.c) against the dequantised reference: the
weights it reads from Q4_0 / Q4_1 / Q8_0 blocks are the values ggml's dequantiser gives, and its
activations are quantised per 32 values to int8 as ggml's Q8_0 does."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from replica.engine.models.gguf_quants import dequantize
from replica.engine.runner import native

TYPE_IDS = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}


@pytest.fixture(scope="module", params=[False, True], ids=["best", "portable"])
def kernel(request):
    k = native.load_gguf_matmul(portable=request.param)
    if k is None:
        pytest.skip("no C compiler here")
    return k


def random_blocks(type_name: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """[n, row bytes] uint8 of random, valid records of `type_name`."""
    nb = n * k // 32
    if type_name == "Q8_0":
        rec = np.zeros(nb, dtype=[("d", "<f2"), ("qs", "i1", (32,))])
        rec["qs"] = rng.integers(-127, 128, (nb, 32))
    else:
        fields = [("d", "<f2")] + ([("m", "<f2")] if type_name == "Q4_1" else []) + [("qs", "u1", (16,))]
        rec = np.zeros(nb, dtype=fields)
        rec["qs"] = rng.integers(0, 256, (nb, 16))
        if type_name == "Q4_1":
            rec["m"] = rng.normal(0, 0.05, nb)
    rec["d"] = rng.uniform(0.001, 0.02, nb)
    return rec.view(np.uint8).reshape(n, -1)


def q8_activations(x: np.ndarray) -> np.ndarray:
    """x [M, K] float32 through ggml's Q8_0 activation quantisation and back."""
    blocks = x.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / 127
    q = np.rint(np.divide(blocks, d, out=np.zeros_like(blocks), where=d > 0))
    return (q * d).reshape(x.shape).astype(np.float32)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
# one row, 1 / 5 / 7 / 18 blocks a row: pairs of blocks, 4 at a time, an odd last one (the 512-bit
# batch-1 path); the last over PARALLEL_MIN_BYTES: both threads
@pytest.mark.parametrize("m,n,k", [(1, 96, 576), (1, 33, 160), (1, 7, 32), (1, 9, 224), (3, 40, 64),
                                   (8, 17, 1536), (11, 33, 96), (2, 640, 1024)])
def test_block_product_equals_dequantised_reference(kernel, type_name, m, n, k):
    rng = np.random.default_rng(m * 1000 + n + k)
    blocks = random_blocks(type_name, n, k, rng)
    weight = dequantize(blocks.reshape(-1), TYPE_IDS[type_name]).reshape(n, k)
    x = rng.normal(0, 1, (m, k)).astype(np.float32)
    got = kernel(torch.from_numpy(blocks.copy()), type_name, torch.from_numpy(x), n).numpy()
    ref = q8_activations(x).astype(np.float64) @ weight.T.astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    exact = x.astype(np.float64) @ weight.T.astype(np.float64)  # int8 activations cost ~1%
    assert np.abs(got - exact).max() <= 0.03 * np.abs(exact).max()


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("m,n", [(1, 640), (5, 33)])
def test_bfloat16_in_and_out_equals_the_float32_product_rounded(kernel, type_name, m, n):
    """The kernel reads bf16 x and writes bf16 y itself: the same bits as the float32 product of
    the same values rounded once (round to nearest even, as torch's .to(bfloat16))."""
    rng = np.random.default_rng(m + n)
    blocks = torch.from_numpy(random_blocks(type_name, n, 576, rng).copy())
    x = torch.from_numpy(rng.normal(0, 1, (m, 576)).astype(np.float32)).bfloat16()
    got = kernel(blocks, type_name, x, n)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, kernel(blocks, type_name, x.float(), n).bfloat16())
    half = kernel(blocks, type_name, x.half(), n)  # other dtypes go through float32
    assert half.dtype == torch.float16
    assert torch.equal(half, kernel(blocks, type_name, x.half().float(), n).half())


def test_unsupported_shapes_are_refused(kernel):
    blocks = torch.zeros(4, 20, dtype=torch.uint8)
    with pytest.raises(ValueError):
        kernel(blocks, "Q4_1", torch.zeros(1, 33), 4)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("m", [1, 3])
def test_threads_split_the_rows_without_changing_a_bit(kernel, type_name, m):
    """Over PARALLEL_MIN_BYTES each thread computes a contiguous share of the output rows (a row
    count that does not divide evenly among them); every row is the one-thread row, bit for bit."""
    rng = np.random.default_rng(7 + m)
    blocks = torch.from_numpy(random_blocks(type_name, 1001, 576, rng).copy())
    x = torch.from_numpy(rng.normal(0, 1, (m, 576)).astype(np.float32)).bfloat16()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel(blocks, type_name, x, 1001)
        results = []
        for threads in (2, 3):
            torch.set_num_threads(threads)
            results.append(kernel(blocks, type_name, x, 1001))
    finally:
        torch.set_num_threads(before)
    for got in results:
        assert torch.equal(got, one)


@pytest.mark.parametrize("m,n,k", [(1, 96, 576), (3, 40, 64), (8, 17, 1536), (11, 33, 96), (2, 640, 1024)])
def test_q8_0_against_float_activations_is_the_dequantised_float32_product(kernel, m, n, k):
    """"Q8_0_FX" (int8 weight-only): the same Q8_0 blocks against x as given, not quantised: the
    float32 product of the dequantised weights up to float32 summation order; bf16 in and out is
    that product of the same values rounded once; threads change no bit."""
    rng = np.random.default_rng(m * 7 + n + k)
    blocks = torch.from_numpy(random_blocks("Q8_0", n, k, rng).copy())
    weight = dequantize(blocks.numpy().reshape(-1), TYPE_IDS["Q8_0"]).reshape(n, k).astype(np.float64)
    x = rng.normal(0, 1, (m, k)).astype(np.float32)
    got = kernel(blocks, "Q8_0_FX", torch.from_numpy(x), n).numpy()
    ref = x.astype(np.float64) @ weight.T
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    xb = torch.from_numpy(x).bfloat16()
    assert torch.equal(kernel(blocks, "Q8_0_FX", xb, n), kernel(blocks, "Q8_0_FX", xb.float(), n).bfloat16())
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel(blocks, "Q8_0_FX", xb, n)
        torch.set_num_threads(3)
        assert torch.equal(kernel(blocks, "Q8_0_FX", xb, n), one)
    finally:
        torch.set_num_threads(before)
