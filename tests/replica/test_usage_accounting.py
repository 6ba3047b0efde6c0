"""What a request is billed for equals what the replica's counters count: prefilled prompt
tokens (prefix-cache hits included, recompute not again) and generated tokens; an abort
mid-prefill reports the tokens prefilled so far; the usage ledger and the control request."""
import json
import threading

import numpy as np
import pytest
import torch

from replica.backend.control_request import ControlRequest, control_reply, parse_control
from replica.backend.usage_ledger import FINISHED, ComputedUsage, UsageLedger
from replica.engine.sampling_params import InvalidRequestError, SamplingParams
from tests.replica.tiny_llama import TINY, hf_model, our_engine


@pytest.fixture(scope="module")
def state_dict():
    return hf_model(TINY).state_dict()


def greedy(max_tokens):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def run(engine, request_ids):
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    return {rid: finals[rid] for rid in request_ids if rid in finals}


def test_abort_mid_prefill_reports_the_prefilled_tokens(state_dict):
    # 16-token prefill chunks: after one step a 40-token prompt has 16 tokens prefilled.
    engine = our_engine(TINY, state_dict, max_num_batched_tokens=16, enable_prefix_caching=False)
    engine.add_request("long", list(range(3, 43)), greedy(4))
    assert engine.step() == []
    final = engine.abort_request("long")
    assert (final.finished, final.num_prompt_tokens, final.num_output_tokens) == (True, 16, 0)
    assert engine.stats().prompt_tokens == 16 and engine.stats().generated_tokens == 0


def test_billed_tokens_equal_the_counters_with_cache_hits_and_preemption(state_dict):
    # A small KV pool forces preemption by recompute; a shared prefix gives cache hits.
    engine = our_engine(TINY, state_dict, kv_cache_bytes=24 * 2 * 2 * 16 * 16 * 4,
                        max_num_batched_tokens=64)
    prefix = list(range(3, 35))
    prompts = {f"r{i}": prefix + [40 + i] * (3 + i) for i in range(6)}
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, greedy(24))
    finals = run(engine, list(prompts))
    stats = engine.stats()
    assert stats.num_preemptions > 0 and stats.prefix_hit_tokens > 0
    assert sum(f.num_prompt_tokens for f in finals.values()) == stats.prompt_tokens
    assert sum(f.num_output_tokens for f in finals.values()) == stats.generated_tokens
    assert all(f.num_prompt_tokens == len(prompts[rid]) for rid, f in finals.items())
    assert all(f.num_cached_tokens <= f.num_prompt_tokens for f in finals.values())


def test_the_ledger_tracks_running_finished_and_unknown():
    ledger = UsageLedger(capacity=2)
    ledger.open("a")
    assert ledger.lookup(["a", "b"])["a"].state == "running"
    assert ledger.lookup(["b"])["b"].state == "unknown"
    done = threading.Event()

    def finish_later():
        done.wait(5)
        ledger.close("a", ComputedUsage(FINISHED, 7, 0, 3, "abort"))

    thread = threading.Thread(target=finish_later)
    thread.start()
    done.set()
    usage = ledger.wait(["a"], timeout_s=10)["a"]
    thread.join()
    assert (usage.state, usage.input_tokens, usage.output_tokens) == ("finished", 7, 3)
    for rid in ("b", "c"):
        ledger.open(rid)
        ledger.close(rid, ComputedUsage(FINISHED, 1, 0, 1, "stop"))
    assert ledger.lookup(["a"])["a"].state == "unknown"  # the oldest fell out (capacity 2)
    ledger.open("d")
    ledger.forget("d")  # refused at submit: nothing computed
    assert ledger.lookup(["d"])["d"].state == "unknown"


def test_the_ledger_forgets_entries_older_than_max_age():
    now = [0.0]
    ledger = UsageLedger(max_age_s=60, clock=lambda: now[0])
    ledger.open("a")
    ledger.close("a", ComputedUsage(FINISHED, 1, 0, 1, "stop"))
    now[0] = 61.0
    ledger.open("b")
    ledger.close("b", ComputedUsage(FINISHED, 1, 0, 1, "stop"))
    assert ledger.lookup(["a"])["a"].state == "unknown"


def control(payload) -> np.ndarray:
    return np.array([json.dumps(payload).encode()], dtype=np.object_)


def test_control_requests_are_validated():
    command = parse_control(control({"usage": ["a", "b"], "abort": True, "wait_s": 2}))
    assert command == ControlRequest(("a", "b"), True, 2.0)
    for bad in ({"usage": "a"}, {"usage": [1]}, {"usage": ["a"], "wait_s": 99},
                {"usage": ["a"], "abort": "yes"}, ["a"]):
        with pytest.raises(InvalidRequestError):
            parse_control(control(bad))
    with pytest.raises(InvalidRequestError):
        parse_control(np.array([b"{not json"], dtype=np.object_))
    reply = json.loads(control_reply({"a": ComputedUsage(FINISHED, 4, 1, 2, "stop")}))
    assert reply["usage"]["a"]["input_tokens"] == 4
