"""The batch's greedy picks (csrc/row_argmax.c) equal torch.argmax and the sampler's fitness
check, in both builds; the sampler gives the same tokens and errors with it as without."""
from __future__ import annotations

import pytest
import torch

from replica.engine.runner import native
from replica.engine.runner.sampler import SampleError, Sampler
from replica.engine.sampling_params import SamplingParams


@pytest.fixture(scope="module", params=[False, True], ids=["best", "portable"])
def kernel(request):
    k = native.load_row_argmax(portable=request.param)
    if k is None:
        pytest.skip("no C compiler here: the sampler uses torch.argmax (tested elsewhere)")
    return k


@pytest.mark.parametrize("n", [1, 15, 16, 17, 100, 49152])
def test_first_maximum_like_torch(kernel, n):
    g = torch.Generator().manual_seed(n)
    logits = torch.randn(9, n, generator=g)
    logits[1] = 0.0  # all tied: the first index
    logits[2, -1] = 50.0  # the maximum in the tail
    logits[3] = torch.randint(0, 3, (n,), generator=g).float()  # ties spread over lanes
    logits[4, : n // 2] = float("-inf")  # masked logits are just masks
    index, fit = kernel(logits)
    assert index.tolist() == torch.argmax(logits, dim=-1).tolist()
    assert fit.all()


def test_rows_unfit_to_sample(kernel):
    logits = torch.randn(5, 37)
    logits[0, 20] = float("nan")
    logits[1, 36] = float("nan")  # in the tail
    logits[2, 3] = float("inf")
    logits[3] = float("-inf")
    index, fit = kernel(logits)
    assert fit.tolist() == [False, False, False, False, True]
    assert index[4] == torch.argmax(logits[4])


def test_sampler_same_with_and_without_the_kernel(kernel):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 1000, generator=g)
    logits[2, 5] = float("nan")
    logits[4] = float("-inf")
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_p=0.9),
              SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=5),
              SamplingParams(temperature=1.0), SamplingParams(temperature=0.0)]
    seeds, indices = [1, 2, 3, 4, 5, 6], [0, 3, 0, 7, 0, 0]
    ours = Sampler(kernel).sample(logits, params, seeds, indices)
    assert ours == Sampler().sample(logits, params, seeds, indices)
    assert isinstance(ours[2], SampleError) and isinstance(ours[4], SampleError)
    assert ours[0] == int(torch.argmax(logits[0])) and ours[5] == int(torch.argmax(logits[5]))
