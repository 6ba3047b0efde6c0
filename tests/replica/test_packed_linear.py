"""PackedLinear / packed_linear: the bfloat16 CPU product on a weight pre-packed for oneDNN
equals F.linear bit for bit, at decode's and prefill's row counts, and follows the weight."""
import pytest
import torch

from replica.engine.models import llama
from replica.engine.models.llama import PackedLinear, packed_linear


@pytest.mark.parametrize("rows", [1, 3, 8, 17, 64, 130])
@pytest.mark.parametrize("n,k", [(96, 64), (288, 96), (200, 160)])
def test_packed_product_is_f_linear_bit_for_bit(rows, n, k):
    torch.manual_seed(rows * 1000 + n + k)
    lin = PackedLinear(k, n, bias=False).to(torch.bfloat16)
    x = torch.randn(rows, k).to(torch.bfloat16)
    with torch.inference_mode():
        got = lin(x)
        want = torch.nn.functional.linear(x, lin.weight)
    assert torch.equal(got, want)
    assert llama._PACKING == (getattr(lin, "_packed", None) is not None)


def test_packed_copy_follows_the_weight():
    lin = PackedLinear(64, 48, bias=False).to(torch.bfloat16)
    x = torch.randn(4, 64).to(torch.bfloat16)
    with torch.no_grad():
        lin(x)
        lin.weight.mul_(2)  # in place: same storage, new version
        assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight))
        lin.weight = torch.nn.Parameter(torch.randn(48, 64).to(torch.bfloat16))  # new storage
        assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight))


def test_other_dtypes_and_the_switch_use_f_linear():
    lin = PackedLinear(64, 48, bias=False)  # float32: F.linear (the packed GEMM is not MKL's bits)
    x = torch.randn(5, 64)
    assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight))
    assert getattr(lin, "_packed", None) is None
    holder = type("H", (), {})()
    w, xb = torch.randn(32, 64).to(torch.bfloat16), torch.randn(2, 64).to(torch.bfloat16)
    PackedLinear.enabled = False
    try:
        assert torch.equal(packed_linear(xb, w, holder), torch.nn.functional.linear(xb, w))
        assert getattr(holder, "_packed", None) is None
    finally:
        PackedLinear.enabled = True
    assert packed_linear(xb[:0], w, holder).shape == (0, 32)
