"""KV pools in huge pages: the advice changes where the memory lies, never what it holds."""
from __future__ import annotations

import torch

from replica.engine.runner.hugepages import HUGE_PAGE, advise_huge, huge_zeros


def test_huge_zeros_is_zeros_of_the_shape_and_aligned():
    t = huge_zeros((300, 16, 3, 64), torch.bfloat16)
    assert t.shape == (300, 16, 3, 64) and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert t.data_ptr() % HUGE_PAGE == 0
    assert not t.any()
    t.view(-1, 3, 64).index_copy_(0, torch.tensor([5, 4799]), torch.ones(2, 3, 64, dtype=torch.bfloat16))
    assert int(t.sum()) == 2 * 3 * 64


def test_small_tensors_are_not_advised():
    assert advise_huge(torch.zeros(1000)) is False
