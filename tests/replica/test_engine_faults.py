"""No request can kill the engine: extreme sampling values, non-finite logits, a failing step.

The sampler is driven with hand-made logits; the engine runs the tiny Llama (real model, real
scheduler and KV cache) with a fault put into its model's forward where a test needs one.
"""
from __future__ import annotations

import pytest
import torch

from replica.engine.engine_loop import Engine, EngineLoop
from replica.engine.llm_engine import EngineFault
from replica.engine.request import ErrorKind, FinishReason
from replica.engine.runner.sampler import SampleError, Sampler, sample_one
from replica.engine.sampling_params import GREEDY_TEMPERATURE, InvalidRequestError, SamplingParams
from tests.replica.tiny_llama import TINY, hf_model, our_engine

EXTREME = {
    "tiny_temperature": SamplingParams(max_tokens=6, temperature=1e-45, ignore_eos=True),
    "below_floor": SamplingParams(max_tokens=6, temperature=GREEDY_TEMPERATURE / 2, ignore_eos=True),
    "at_floor": SamplingParams(max_tokens=6, temperature=GREEDY_TEMPERATURE, seed=1, ignore_eos=True),
    "tiny_top_p": SamplingParams(max_tokens=6, temperature=1.0, top_p=1e-45, seed=2, ignore_eos=True),
    "huge_top_k": SamplingParams(max_tokens=6, temperature=1.0, top_k=10**18, seed=3, ignore_eos=True),
    "hot": SamplingParams(max_tokens=6, temperature=100.0, top_p=1e-45, top_k=1 << 40, seed=4, ignore_eos=True),
    # Seeds outside 64 bits are refused when the parameters are built (test_sampling.py).
    "largest_seed": SamplingParams(max_tokens=6, temperature=0.7, seed=(1 << 63) - 1, ignore_eos=True),
    "smallest_seed": SamplingParams(max_tokens=6, temperature=0.7, seed=-(1 << 63), ignore_eos=True),
    "huge_max_tokens": SamplingParams(max_tokens=10**30, temperature=0.0, stop_token_ids=(10**30,)),
}


@pytest.fixture(scope="module")
def state_dict():
    return {k: v.clone() for k, v in hf_model(TINY).state_dict().items()}


def _run(engine, requests: dict[str, tuple[list[int], SamplingParams]]):
    """-> {id: final RequestOutput}, plus every token seen per id."""
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    finals, tokens = {}, {rid: [] for rid in requests}
    for _ in range(10_000):
        if not engine.has_unfinished_requests():
            break
        for o in engine.step():
            tokens[o.request_id].extend(o.new_token_ids)
            if o.finished:
                finals[o.request_id] = o
    return finals, tokens


# ---- the sampler ------------------------------------------------------------------------------

def test_temperatures_below_the_floor_are_greedy_and_never_divide():
    logits = torch.tensor([3.0, 9.0, -1.0, 8.9])
    for t in (1e-45, 5e-324, GREEDY_TEMPERATURE / 10):
        params = SamplingParams(temperature=t)
        assert params.greedy
        assert sample_one(logits, params, seed=0, index=0) == 1
    # At the floor it samples, and a logit gap of 0.1 / 1e-5 is still finite and one-hot.
    assert sample_one(logits, SamplingParams(temperature=GREEDY_TEMPERATURE), seed=0, index=0) == 1


def test_extreme_top_p_top_k_and_temperature_are_well_defined():
    logits = torch.tensor([1.0, 4.0, 2.0, 3.9])
    assert sample_one(logits, SamplingParams(temperature=1.0, top_p=1e-45), seed=7, index=0) == 1
    assert sample_one(logits, SamplingParams(temperature=1.0, top_k=10**18), seed=7, index=0) in range(4)
    picks = {sample_one(logits, SamplingParams(temperature=100.0), seed=s, index=0) for s in range(200)}
    assert picks == {0, 1, 2, 3}  # almost uniform, all finite


def test_bfloat16_logits_are_sampled_in_float32():
    logits = torch.tensor([[0.0, 50.0, 49.5]], dtype=torch.bfloat16)
    tokens = Sampler().sample(logits, [SamplingParams(temperature=GREEDY_TEMPERATURE)], [0], [0])
    assert tokens == [1]


def test_a_row_with_non_finite_logits_fails_alone():
    logits = torch.tensor([
        [1.0, 2.0, 3.0],
        [float("nan"), 1.0, 0.0],
        [0.0, float("inf"), 1.0],
        [float("-inf"), 5.0, float("-inf")],  # -inf is a mask, not a fault
        [0.5, 0.1, 0.2],
    ])
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0), SamplingParams(temperature=1.0),
              SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=1.0, top_p=0.5)]
    tokens = Sampler().sample(logits, params, [0] * 5, [0] * 5)
    assert tokens[0] == 2 and tokens[3] == 1 and tokens[4] in (0, 2)  # top_p 0.5 keeps 0 (p 0.42) and 2 (0.31)
    assert isinstance(tokens[1], SampleError) and "non-finite" in tokens[1].message
    assert isinstance(tokens[2], SampleError)


def test_a_degenerate_distribution_falls_back_to_the_greedy_token():
    # Every logit masked but one -inf-only row would give a NaN softmax: argmax is the limit.
    logits = torch.full((4,), float("-inf"))
    assert sample_one(logits, SamplingParams(temperature=1.0), seed=0, index=0) == 0


def test_an_exception_while_sampling_one_row_fails_that_row_only(monkeypatch):
    import replica.engine.runner.sampler as sampler_module

    real = sampler_module.sample_rows

    def flaky(logits, params, seeds, indices, batch_generator, greedy):
        if 666 in seeds:  # the batch pass and the row-by-row retry of the row with seed 666
            raise RuntimeError("boom")
        return real(logits, params, seeds, indices, batch_generator, greedy)

    monkeypatch.setattr(sampler_module, "sample_rows", flaky)
    logits = torch.tensor([[1.0, 2.0], [2.0, 1.0], [0.0, 9.0]])
    params = [SamplingParams(temperature=1.0, top_k=1 << 3), SamplingParams(temperature=1.0),
              SamplingParams(temperature=0.0)]
    tokens = Sampler().sample(logits, params, [1, 666, None], [0, 0, 0])
    assert tokens[0] in (0, 1) and isinstance(tokens[1], SampleError) and "boom" in tokens[1].message
    assert tokens[2] == 1  # greedy: never reaches the random pass


@pytest.mark.parametrize("bad", [
    {"temperature": float("nan")}, {"temperature": float("inf")}, {"temperature": -1e-45},
    {"top_p": float("nan")}, {"top_p": 0.0}, {"top_p": 1.0 + 1e-9}, {"temperature": True},
])
def test_non_finite_and_out_of_range_values_are_refused(bad):
    with pytest.raises(InvalidRequestError):
        SamplingParams.from_dict(bad)


# ---- the engine -------------------------------------------------------------------------------

def test_extreme_sampling_values_then_a_normal_request_on_the_same_engine(state_dict):
    engine = our_engine(TINY, state_dict)
    requests = {name: ([5, 6, 7, i], params) for i, (name, params) in enumerate(EXTREME.items())}
    finals, tokens = _run(engine, {k: v for k, v in requests.items() if k != "huge_max_tokens"})
    for name, final in finals.items():
        assert final.error is None and final.finish_reason == FinishReason.LENGTH, (name, final)
        assert len(tokens[name]) == 6
    # A tiny temperature gives exactly the greedy output.
    greedy, greedy_tokens = _run(engine, {"greedy": ([5, 6, 7, 0], SamplingParams(max_tokens=6, temperature=0.0,
                                                                                   ignore_eos=True))})
    assert tokens["tiny_temperature"] == greedy_tokens["greedy"]
    # max_tokens beyond anything stops at the context window.
    finals, tokens = _run(engine, {"long": requests["huge_max_tokens"]})
    assert finals["long"].finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks


def test_prompt_token_ids_outside_the_vocabulary_are_refused(state_dict):
    engine = our_engine(TINY, state_dict)
    for ids in ([TINY.vocab_size], [-1], [1, 2, 10**12]):
        with pytest.raises(InvalidRequestError, match="token ids"):
            engine.add_request("x", ids, SamplingParams())
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("ids, needle", [
    ([], "the prompt is empty"),
    ([TINY.vocab_size], "token ids must lie in"),
    ([1] * 10_000, "context window"),
])
def test_one_prompt_check_for_the_engine_and_its_loop(state_dict, ids, needle):
    """The loop refuses on the caller's thread with the engine's own check and message."""
    engine = our_engine(TINY, state_dict)
    assert isinstance(engine, Engine)
    with pytest.raises(InvalidRequestError, match=needle):
        engine.add_request("direct", ids, SamplingParams())
    loop = EngineLoop(engine)
    loop.start()
    try:
        with pytest.raises(InvalidRequestError, match=needle):
            loop.submit("looped", ids, SamplingParams(), on_output=lambda output: None)
        assert loop.num_open == 0
    finally:
        loop.stop()


def _break_rows(engine, rows_for: dict[str, float]):
    """Make the model's logits `value` for the rows of the given request ids."""
    runner = engine.runner
    real_sample = runner.sampler.sample
    scheduler = engine.scheduler

    def sample(logits, params, seeds, indices):
        logits = logits.clone()
        ids = [r.request_id for r in scheduler.running if r.num_computed_tokens >= 0]
        by_params = {id(scheduler.requests[rid].sampling_params): rid for rid in ids if rid in scheduler.requests}
        for row, p in enumerate(params):
            rid = by_params.get(id(p))
            if rid in rows_for:
                logits[row] = rows_for[rid]
        return real_sample(logits, params, seeds, indices)

    runner.sampler.sample = sample


def test_non_finite_logits_fail_that_request_alone_and_the_engine_goes_on(state_dict):
    engine = our_engine(TINY, state_dict)
    _break_rows(engine, {"nan": float("nan")})
    finals, tokens = _run(engine, {
        "nan": ([5, 6, 7], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)),
        "ok": ([5, 6, 8], SamplingParams(max_tokens=5, temperature=0.8, seed=3, ignore_eos=True)),
    })
    assert finals["nan"].error_kind == ErrorKind.INTERNAL and "non-finite" in finals["nan"].error
    assert finals["nan"].finished and finals["nan"].finish_reason == FinishReason.ABORT
    assert finals["ok"].error is None and len(tokens["ok"]) == 5
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks


def _fail_forward(engine, times: int):
    model = engine.runner.model
    real = model.forward
    state = {"left": times}

    def forward(*args, **kwargs):
        if state["left"] > 0:
            state["left"] -= 1
            raise RuntimeError("kernel fault")
        return real(*args, **kwargs)

    model.forward = forward


def test_a_failed_step_fails_its_requests_and_later_ones_are_served(state_dict):
    engine = our_engine(TINY, state_dict)
    _fail_forward(engine, times=1)
    finals, _ = _run(engine, {"a": ([5, 6, 7], SamplingParams(max_tokens=3, temperature=0.0))})
    assert finals["a"].error_kind == ErrorKind.INTERNAL and "kernel fault" in finals["a"].error
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks
    finals, tokens = _run(engine, {"b": ([5, 6, 7], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))})
    assert finals["b"].error is None and len(tokens["b"]) == 3
    # Nothing of the failed step entered the prefix cache: the same prompt again is exact.
    fresh = our_engine(TINY, state_dict)
    _, expected = _run(fresh, {"b": ([5, 6, 7], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))})
    assert tokens["b"] == expected["b"]


def test_steps_failing_over_and_over_kill_the_engine(state_dict):
    engine = our_engine(TINY, state_dict)
    _fail_forward(engine, times=100)
    for i in range(engine.max_failed_steps - 1):
        engine.add_request(f"r{i}", [5, 6, i], SamplingParams(max_tokens=3))
        outputs = engine.step()
        assert [o.error_kind for o in outputs] == [ErrorKind.INTERNAL]
    engine.add_request("last", [5, 6, 9], SamplingParams(max_tokens=3))
    with pytest.raises(EngineFault, match="in a row"):
        engine.step()
