"""Scheduler: continuous batching, priorities, fair share, preemption (pure logic, no model)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from replica.engine.kv.manager import KVCacheManager
from replica.engine.request import FinishReason, Request
from replica.engine.sampling_params import SamplingParams
from replica.engine.scheduler import Scheduler

EOS = (2,)


def _scheduler(num_blocks=64, block_size=4, max_num_seqs=8, budget=32, max_len=1024) -> Scheduler:
    return Scheduler(KVCacheManager(num_blocks, block_size), max_num_seqs, budget, max_len)


def _req(rid, n_prompt=6, max_tokens=4, priority=0, tenant="", t=0.0) -> Request:
    return Request(rid, list(range(10, 10 + n_prompt)), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   arrival_time=t, priority=priority, tenant=tenant)


def _step(s: Scheduler):
    out = s.schedule()
    sampled = {r.request_id: 7 for r, n in out.scheduled if r.num_computed_tokens + n == r.num_tokens}
    s.update(out, sampled, EOS)
    return out


def test_decode_and_chunked_prefill_share_a_step():
    s = _scheduler(budget=8)
    s.add_request(_req("a", n_prompt=4, max_tokens=10))
    _step(s)  # a prefilled, first token sampled
    s.add_request(_req("b", n_prompt=20, t=1.0))
    out = s.schedule()
    assert [(r.request_id, n) for r, n in out.scheduled] == [("a", 1), ("b", 7)]


def test_priority_then_fair_share_then_arrival():
    s = _scheduler(max_num_seqs=1)
    s.tenant_served.update({"heavy": 100.0, "light": 5.0})
    s.add_request(_req("heavy-1", tenant="heavy", t=0.0))
    s.add_request(_req("light-1", tenant="light", t=1.0))
    s.add_request(_req("urgent", tenant="heavy", priority=-1, t=2.0))
    order = []
    while s.has_unfinished_requests():
        out = _step(s)
        for r, _ in out.scheduled:
            if r.request_id not in order:
                order.append(r.request_id)
    assert order == ["urgent", "light-1", "heavy-1"]


def test_returning_tenant_gets_no_banked_credit():
    s = _scheduler()
    s.tenant_served.update({"a": 500.0, "old": 0.0})
    s.add_request(_req("a1", tenant="a"))
    s.add_request(_req("old1", tenant="old"))
    assert s.tenant_served["old"] == 500.0  # lifted to the least-served active tenant


def test_preemption_victim_is_lowest_priority_latest_arrival():
    # 4 blocks of 4 tokens; three sequences of 5 tokens need 2 blocks each to decode
    s = _scheduler(num_blocks=5, block_size=4, budget=64)
    s.add_request(_req("hi", n_prompt=4, priority=0, t=0.0, max_tokens=8))
    s.add_request(_req("lo-early", n_prompt=4, priority=5, t=1.0, max_tokens=8))
    s.add_request(_req("lo-late", n_prompt=4, priority=5, t=2.0, max_tokens=8))
    _step(s)  # three prefills, one block each
    out = _step(s)  # each needs a second block: only two free
    assert out.preempted_ids == ["lo-late"]
    assert s.requests["lo-late"].num_computed_tokens == 0
    while s.has_unfinished_requests():
        _step(s)
    assert s.kv.num_free_blocks == 5


def test_waiting_high_priority_preempts_running_batch_work():
    s = _scheduler(max_num_seqs=1)
    s.add_request(_req("batch", priority=10, max_tokens=50))
    _step(s)
    s.add_request(_req("interactive", priority=0, t=1.0))
    out = _step(s)
    assert out.preempted_ids == ["batch"]
    assert [r.request_id for r, _ in out.scheduled] == ["interactive"]


def test_sequence_longer_than_pool_finishes_with_length():
    s = _scheduler(num_blocks=3, block_size=4)  # 12 tokens at most
    s.add_request(_req("a", n_prompt=6, max_tokens=100))
    while s.has_unfinished_requests():
        _step(s)
    assert s.kv.num_free_blocks == 3


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(1, 12), st.integers(0, 2), st.booleans()),
                min_size=1, max_size=20),
       st.integers(4, 16))
def test_random_workloads_finish_and_free_everything(reqs, num_blocks):
    """Random mixes with aborts under a small pool: everything finishes (no deadlock) and every
    block returns with ref count zero."""
    s = _scheduler(num_blocks=num_blocks, block_size=4, max_num_seqs=4, budget=16)
    for i, (n_prompt, max_tokens, prio, abort) in enumerate(reqs):
        if n_prompt + 1 > s.max_seq_len:
            continue
        s.add_request(_req(f"r{i}", n_prompt=n_prompt, max_tokens=max_tokens, priority=prio, t=float(i)))
    steps = 0
    while s.has_unfinished_requests():
        _step(s)
        steps += 1
        for i, (_, _, _, abort) in enumerate(reqs):
            r = s.requests.get(f"r{i}")
            if abort and r is not None and steps % 3 == 0:
                s.finish(r, FinishReason.ABORT)
        assert steps < 2000, "scheduler made no progress"
    assert s.kv.num_free_blocks == num_blocks
    assert all(s.kv.pool.ref_count(b) == 0 for b in range(num_blocks))


def _ids(out) -> list[str]:
    return [r.request_id for r, _ in out.scheduled]


def test_a_newcomer_shares_the_step_with_a_burst():
    """Nothing is held back: the platform's admission bounds what a burst holds in the engine,
    and a newcomer's prefill runs in the same step as the burst's decodes (work-conserving)."""
    s = _scheduler(budget=64)
    s.add_request(_req("a1", tenant="A", max_tokens=10))
    s.add_request(_req("a2", tenant="A", max_tokens=10))
    _step(s)  # A runs two sequences
    s.add_request(_req("a3", tenant="A", t=1.0))  # A's burst goes on
    s.add_request(_req("b1", tenant="B", t=2.0))  # B arrives with nothing running
    out = _step(s)
    assert sorted(_ids(out)) == ["a1", "a2", "a3", "b1"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(1, 12), st.integers(0, 3),
                          st.integers(0, 8)), min_size=1, max_size=20),
       st.integers(4, 16))
def test_random_multi_tenant_arrivals_finish_and_free_everything(reqs, num_blocks):
    """Tenants arriving over time: everything finishes, every block returns, and no step is
    empty while work is pending."""
    s = _scheduler(num_blocks=num_blocks, block_size=4, max_num_seqs=4, budget=16)
    pending = sorted(enumerate(reqs), key=lambda item: item[1][3])
    steps = 0
    while pending or s.has_unfinished_requests():
        while pending and pending[0][1][3] <= steps:
            i, (n_prompt, max_tokens, tenant, _) = pending.pop(0)
            if n_prompt + 1 <= s.max_seq_len:
                s.add_request(_req(f"r{i}", n_prompt=n_prompt, max_tokens=max_tokens,
                                   tenant=f"t{tenant}", t=float(steps)))
        if s.has_unfinished_requests():
            out = _step(s)
            assert not out.is_empty or out.preempted_ids, "a step idled with work pending"
        steps += 1
        assert steps < 2000, "scheduler made no progress"
    assert s.kv.num_free_blocks == num_blocks


