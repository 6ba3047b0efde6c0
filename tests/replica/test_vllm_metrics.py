"""VllmMetrics with a recording stand-in for Triton's pb_utils metrics (pure logic: gauges from
EngineStats, counters by delta, TTFT and inter-token observations per request)."""
from types import SimpleNamespace

import pytest

from replica.backend import vllm_metrics as vm


class Metric:
    def __init__(self, labels, buckets=None):
        self.labels, self.buckets = labels, buckets
        self.value, self.observed = 0.0, []

    def set(self, value):
        self.value = value

    def increment(self, value):
        self.value += value

    def observe(self, value):
        self.observed.append(value)


class Family:
    GAUGE, COUNTER, HISTOGRAM = "gauge", "counter", "histogram"
    made: dict = {}

    def __init__(self, name, description, kind):
        self.name, self.kind = name, kind
        Family.made[name] = self

    def Metric(self, labels, buckets=None):  # noqa: N802 - pb_utils' name
        self.metric = Metric(labels, buckets)
        return self.metric


def stats(**overrides):
    base = dict(num_running=2, num_waiting=1, num_free_blocks=30, num_free_uncached_blocks=20,
                num_total_blocks=40,
                prefix_hit_tokens=16, prompt_tokens=50, generated_tokens=7, num_preemptions=0)
    return SimpleNamespace(**{**base, **overrides})


@pytest.fixture
def metrics():
    Family.made = {}
    now = [100.0]
    m = vm.VllmMetrics(SimpleNamespace(MetricFamily=Family), "chat-small", clock=lambda: now[0])
    return m, now


def value(name):
    return Family.made[name].metric.value


def test_gauges_and_counters_follow_engine_stats(metrics):
    m, _ = metrics
    m.update(stats())
    assert (value(vm.RUNNING), value(vm.WAITING), value(vm.KV_USAGE)) == (2, 1, 0.25)
    assert (value(vm.PREFIX_QUERIES), value(vm.PREFIX_HITS)) == (66, 16)
    m.update(stats(prompt_tokens=60, generated_tokens=9, prefix_hit_tokens=16))
    assert (value(vm.PREFIX_QUERIES), value(vm.PROMPT_TOKENS), value(vm.GENERATION_TOKENS)) == (
        76, 60, 9)
    assert Family.made[vm.RUNNING].metric.labels == {"model_name": "chat-small"}
    assert all(name.startswith("vllm:") for name in Family.made)


def test_ttft_then_inter_token_latency_per_token(metrics):
    m, now = metrics
    m.arrived("r1")
    now[0] = 100.5
    m.output("r1", 1, finished=False)
    now[0] = 100.7
    m.output("r1", 3, finished=False)  # two tokens in one output: two gaps of 0.1 s
    now[0] = 100.8
    m.output("r1", 3, finished=True)  # no new token: nothing observed, the request forgotten
    assert Family.made[vm.TTFT].metric.observed == [pytest.approx(0.5)]
    assert Family.made[vm.ITL].metric.observed == [pytest.approx(0.1)] * 2
    m.output("r1", 4, finished=False)  # unknown now: ignored
    assert len(Family.made[vm.ITL].metric.observed) == 2
    assert Family.made[vm.TTFT].metric.buckets == vm.TTFT_BUCKETS
