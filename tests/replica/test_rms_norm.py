"""The bfloat16 RMSNorm kernel (csrc/rms_norm.c), with and without the residual add, against the
model's PyTorch path (the same roundings as Hugging Face's LlamaRMSNorm)."""
from __future__ import annotations

import pytest
import torch

from replica.engine.models.llama import RMSNorm
from replica.engine.runner import native


@pytest.fixture(scope="module")
def kernel():
    k = native.load_rms_norm()
    if k is None:
        pytest.skip("no C compiler here")
    return k


def reference(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = h.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(h.dtype)


def assert_close_in_bf16(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit-equal but for the mean's summation order: at most one bfloat16 unit in the last place
    apart, and rarely."""
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape
    ulp = torch.finfo(torch.bfloat16).eps * want.float().abs().clamp_min(1e-30)
    assert bool(((got.float() - want.float()).abs() <= ulp).all())
    assert (got != want).float().mean() < 0.01


@pytest.mark.parametrize("rows,hidden", [(1, 576), (64, 576), (5, 96), (3, 17)])
def test_norm_alone_matches_the_pytorch_path(kernel, rows, hidden):
    g = torch.Generator().manual_seed(rows * hidden)
    x = (torch.randn(rows, hidden, generator=g) * 3).bfloat16()
    weight = (torch.rand(hidden, generator=g) + 0.5).bfloat16()
    h, out = kernel(x, weight, 1e-5)
    assert h is x
    assert_close_in_bf16(out, reference(x, weight, 1e-5))


@pytest.mark.parametrize("rows,hidden", [(1, 576), (64, 576), (7, 64)])
def test_residual_add_then_norm_matches_the_pytorch_path(kernel, rows, hidden):
    g = torch.Generator().manual_seed(rows + hidden)
    x = (torch.randn(rows, hidden, generator=g) * 10).bfloat16()
    residual = torch.randn(rows, hidden, generator=g).bfloat16()
    weight = torch.randn(hidden, generator=g).bfloat16()
    h, out = kernel(x, weight, 1e-6, residual)
    assert torch.equal(h, x + residual)  # bf16 add: the float sum rounded once, as torch does
    assert_close_in_bf16(out, reference(x + residual, weight, 1e-6))


def test_the_module_uses_the_kernel_in_bfloat16_and_torch_otherwise(kernel):
    norm = RMSNorm(64, 1e-5, kernel).bfloat16()
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2, 64))
    x, r = torch.randn(4, 64).bfloat16(), torch.randn(4, 64).bfloat16()
    h, out = norm.add_and_norm(x, r)
    plain = RMSNorm(64, 1e-5).bfloat16()
    plain.load_state_dict(norm.state_dict())
    want_h, want = plain.add_and_norm(x, r)
    assert torch.equal(h, want_h)
    assert_close_in_bf16(out, want)
    f32 = RMSNorm(64, 1e-5, kernel)  # float32: PyTorch's fused rms_norm, the kernel is bf16 only
    assert torch.allclose(f32(x.float()), reference(x.float(), f32.weight, 1e-5), atol=1e-6)


def test_a_hidden_size_beyond_the_kernel_is_refused(kernel):
    with pytest.raises(ValueError):
        kernel(torch.zeros(1, 20000, dtype=torch.bfloat16), torch.ones(20000, dtype=torch.bfloat16), 1e-5)
