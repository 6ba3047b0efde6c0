"""Sampling and stopping: seeds, top-k/top-p, stop strings and ids, finish reasons, deltas."""
from __future__ import annotations

import pytest
import torch

from replica.engine.detokenizer import IncrementalDetokenizer
from replica.engine.request import FinishReason
from replica.engine.runner.sampler import Sampler, sample_one
from replica.engine.sampling_params import InvalidRequestError, SamplingParams
from tests.replica.tiny_llama import TINY, ByteDecoder, hf_model, our_engine


@pytest.fixture(scope="module")
def state_dict():
    return {k: v.clone() for k, v in hf_model(TINY).state_dict().items()}


def _run(engine, requests):
    """requests: {id: (prompt, params)} -> {id: (tokens, text, finish_reason)}"""
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    out = {rid: ([], [], None) for rid in requests}
    while engine.has_unfinished_requests():
        for o in engine.step():
            tokens, texts, _ = out[o.request_id]
            tokens.extend(o.new_token_ids)
            texts.append(o.text_delta)
            out[o.request_id] = (tokens, texts, o.finish_reason)
    return {rid: (t, "".join(x), r) for rid, (t, x, r) in out.items()}


def test_seeded_sampling_is_reproducible_whatever_the_batch(state_dict):
    params = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    alone = _run(our_engine(TINY, state_dict), {"a": ([5, 6, 7], params)})["a"][0]
    crowd = {f"n{i}": ([9 + i, 10], SamplingParams(max_tokens=15, temperature=1.0, ignore_eos=True)) for i in range(5)}
    crowd["a"] = ([5, 6, 7], params)
    together = _run(our_engine(TINY, state_dict, max_num_batched_tokens=4), crowd)["a"][0]
    assert alone == together
    other_seed = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, seed=99, ignore_eos=True)
    assert _run(our_engine(TINY, state_dict), {"a": ([5, 6, 7], other_seed)})["a"][0] != alone


def test_top_k_and_top_p_restrict_the_choice():
    logits = torch.tensor([5.0, 4.0, 3.0, -10.0, -10.0])
    picks = {sample_one(logits, SamplingParams(temperature=1.0, top_k=2), seed=s, index=0) for s in range(200)}
    assert picks == {0, 1}
    # p(0) ~ 0.66: top_p 0.5 keeps the first token only
    picks = {sample_one(logits, SamplingParams(temperature=1.0, top_p=0.5), seed=s, index=0) for s in range(200)}
    assert picks == {0}
    picks = {sample_one(logits, SamplingParams(temperature=5.0), seed=s, index=0) for s in range(400)}
    assert picks == {0, 1, 2, 3, 4}


def test_finish_reasons_and_stop_token_ids(state_dict):
    engine = our_engine(TINY, state_dict)
    greedy = _run(engine, {"g": ([5, 6, 7], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))})["g"]
    assert greedy[2] == FinishReason.LENGTH and len(greedy[0]) == 12
    stop_id = greedy[0][4]
    first = greedy[0].index(stop_id)
    out = _run(engine, {"s": ([5, 6, 7], SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=(stop_id,)))})["s"]
    assert out[2] == FinishReason.STOP and out[0] == greedy[0][: first + 1]


def test_stop_string_truncates_and_is_never_streamed():
    decoder = ByteDecoder()
    detok = IncrementalDetokenizer(decoder, [3], stop=["END"])
    emitted, stopped = [], False
    for ch in "hello EN" + "D world":
        delta, stopped = detok.append([ord(ch)])
        emitted.append(delta)
        if stopped:
            break
    assert stopped and "".join(emitted) == "hello "


def test_multibyte_character_is_never_split():
    detok = IncrementalDetokenizer(ByteDecoder(), [3])
    deltas = [detok.append([b])[0] for b in "é🙂".encode()]
    assert deltas == ["", "é", "", "", "", "🙂"]


@pytest.mark.parametrize("bad", [
    {"max_tokens": 0}, {"temperature": -1}, {"top_p": 0}, {"top_k": -1}, {"seed": "x"},
    {"stop": [""]}, {"bogus": 1}, {"stop_token_ids": [-1]}, {"seed": 2**63},
    {"seed": -(2**63) - 1}, {"seed": "9" * 5000},
])
def test_invalid_parameters_are_refused(bad):
    with pytest.raises(InvalidRequestError):
        SamplingParams.from_dict(bad)


def test_too_long_prompt_is_refused_and_others_keep_running(state_dict):
    engine = our_engine(TINY, state_dict)
    engine.add_request("ok", [5, 6], SamplingParams(max_tokens=3, temperature=0.0))
    with pytest.raises(InvalidRequestError, match="context window"):
        engine.add_request("long", [5] * TINY.max_position_embeddings, SamplingParams(max_tokens=3))
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks


# ---- the batch pass (sample_rows): one set of tensor ops for every non-greedy row ---------------

def _expected(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The distribution a request asks for, one row at a time in float64 (the reference)."""
    scaled = logits.double() / temperature
    if top_k:
        scaled = scaled.masked_fill(scaled < torch.topk(scaled, top_k).values[-1], float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    sorted_probs, order = torch.sort(probs, descending=True)
    keep = (torch.cumsum(sorted_probs, -1) - sorted_probs) < top_p
    out = torch.zeros_like(probs)
    out[order[keep]] = sorted_probs[keep]
    return out / out.sum()


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 3, 1.0), (1.3, 0, 0.8), (1.0, 4, 0.9)])
def test_the_batch_pass_draws_each_row_from_its_own_distribution(temperature, top_k, top_p):
    """4,000 unseeded rows of the same logits in one batch (beside rows asking for other
    settings): the frequencies match the requested distribution, and masked tokens never come."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, float("-inf"), -1.0])
    n = 4000
    mine = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    others = [SamplingParams(temperature=2.0, top_k=2), SamplingParams(temperature=0.5, top_p=0.5)]
    params = [mine] * n + others * 50
    batch = logits.expand(len(params), -1).contiguous()
    tokens = Sampler(seed=3).sample(batch, params, [None] * len(params), [0] * len(params))[:n]
    freq = torch.bincount(torch.tensor(tokens), minlength=logits.numel()).double() / n
    expected = _expected(logits, temperature, top_k, top_p)
    assert freq[expected == 0].sum() == 0  # never a masked or cut-off token
    # 4 standard deviations of a binomial frequency at n = 4000
    assert torch.all((freq - expected).abs() <= 4 * (expected * (1 - expected) / n).sqrt() + 1e-9), (freq, expected)


def test_a_seeded_row_draws_the_same_alone_and_in_any_batch():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(9, 500, generator=g)
    seeded = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=77)
    params = [SamplingParams(temperature=1.0, top_k=400), seeded, SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.5, top_p=0.3)] * 2 + [seeded]
    seeds = [p.seed for p in params]
    together = Sampler(seed=1).sample(logits, params, seeds, list(range(9)))
    for row in (1, 5):
        alone = Sampler(seed=2).sample(logits[row : row + 1], [seeded], [77], [row])
        assert together[row] == alone[0] == sample_one(logits[row], seeded, 77, row)


def test_unseeded_rows_share_one_generator_but_not_one_draw():
    logits = torch.zeros(300, 1000)  # uniform
    params = [SamplingParams(temperature=1.0)] * 300
    first = Sampler(seed=5).sample(logits, params, [None] * 300, [0] * 300)
    assert len(set(first)) > 200  # 300 draws from 1000 equally likely tokens: ~260 distinct
    assert first == Sampler(seed=5).sample(logits, params, [None] * 300, [0] * 300)  # the sampler's seed
    assert first != Sampler(seed=6).sample(logits, params, [None] * 300, [0] * 300)


def test_an_overflowing_temperature_falls_back_to_the_greedy_token():
    logits = torch.tensor([[3.0e38, 1.0, -3.0e38], [0.0, 1.0, 2.0]])
    params = [SamplingParams(temperature=0.01), SamplingParams(temperature=0.01)]  # 3e38 / 0.01 = inf
    assert Sampler().sample(logits, params, [None, None], [0, 0]) == [0, 2]
