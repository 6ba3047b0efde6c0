"""The autoscaler's decision logic with an injected clock: no database, no Redis."""
import math

from fleet.scaling_decision import Decision, History, PolicyView, LoadReadings, decide
from fleet.forecast import TimeOfDayProfile, build_profile

POLICY = PolicyView(min_replicas=1, max_replicas=6, warm_pool_size=0, replica_capacity_rps=2.0,
                    target_queue_depth=4, target_outstanding_tokens=1000,
                    scale_up_cooldown_s=10.0, scale_down_cooldown_s=60.0, predictive=True)


class Loop:
    """Drives `decide` over time like the Celery tick: replicas appear at once (loading counts)."""

    def __init__(self, policy: PolicyView, replicas: int = 1):
        self.policy = policy
        self.replicas = replicas
        self.history = History()
        self.decisions: list[Decision] = []

    def tick(self, now: float, **readings) -> Decision:
        s = LoadReadings(num_ready=self.replicas, num_loading=0, **readings)
        d = decide(self.policy, s, now, self.history)
        self.decisions.append(d)
        self.history = History(
            last_scale_up_at=now if d.action == "scale_up" else self.history.last_scale_up_at,
            last_scale_down_at=now if d.action == "scale_down" else self.history.last_scale_down_at,
            recommendations=(*self.history.recommendations, (now, d.recommended)))
        self.replicas = d.desired
        return d


def test_scales_up_on_queue_depth_and_records_the_numbers():
    d = decide(POLICY, LoadReadings(num_ready=1, num_loading=0, queue_depth=10), 100.0, History())
    assert d.action == "scale_up"
    assert d.desired == 1 + math.ceil(10 / 4)
    assert d.numbers["queue_depth"] == 10 and d.numbers["needs"]["queue_depth"] == 4
    assert "queue_depth" in d.reason


def test_scales_up_on_outstanding_tokens_rate_and_ttft():
    by_tokens = decide(POLICY, LoadReadings(1, 0, outstanding_tokens=3500), 0.0, History())
    assert by_tokens.desired == 4
    by_rate = decide(POLICY, LoadReadings(1, 0, request_rate_rps=5.0), 0.0, History())
    assert by_rate.desired == 3
    by_ttft = decide(POLICY, LoadReadings(2, 0, ttft_p90_s=2.5, ttft_target_s=1.0), 0.0, History())
    assert by_ttft.action == "scale_up" and by_ttft.desired == 3
    within = decide(POLICY, LoadReadings(2, 0, ttft_p90_s=0.5, ttft_target_s=1.0), 0.0, History())
    assert within.desired <= 2


def test_capped_at_max_and_loading_replicas_count():
    d = decide(POLICY, LoadReadings(1, 0, queue_depth=400), 0.0, History())
    assert d.desired == POLICY.max_replicas and "capped" in d.reason
    # Three already loading: the same pressure asks for no more than it did.
    again = decide(POLICY, LoadReadings(1, 5, queue_depth=400), 1.0, History(last_scale_up_at=0.0))
    assert again.action == "hold" and again.desired == 6


def test_scale_up_cool_down():
    history = History(last_scale_up_at=95.0)
    d = decide(POLICY, LoadReadings(2, 0, queue_depth=20), 100.0, history)
    assert d.action == "hold" and d.desired == 2 and "cool-down" in d.reason
    later = decide(POLICY, LoadReadings(2, 0, queue_depth=20), 106.0, history)
    assert later.action == "scale_up"


def test_scales_down_when_idle_only_after_the_window():
    loop = Loop(POLICY, replicas=4)
    loop.tick(0.0, request_rate_rps=8.0)  # 4 needed
    actions = [loop.tick(t, request_rate_rps=0.0).action for t in range(5, 60, 5)]
    assert set(actions) == {"hold"}, "no scale down within the window of a higher recommendation"
    assert loop.replicas == 4
    d = loop.tick(65.0, request_rate_rps=0.0)
    assert d.action == "scale_down" and d.desired == POLICY.min_replicas


def test_no_flapping_under_oscillating_load():
    loop = Loop(POLICY, replicas=1)
    # The rate swings between needing 4 and needing 1 every 10 s for 10 minutes.
    for i, t in enumerate(range(0, 600, 5)):
        loop.tick(float(t), request_rate_rps=8.0 if (t // 10) % 2 == 0 else 1.0)
    changes = [d for d in loop.decisions if d.action != "hold"]
    assert changes[0].action == "scale_up" and changes[0].desired == 4
    assert all(d.action != "scale_down" for d in changes), "it never gives back what it needs again soon"
    assert loop.replicas == 4


def test_warm_pool_is_kept_on_top_of_the_load():
    policy = PolicyView(**{**POLICY.__dict__, "warm_pool_size": 2})
    idle = decide(policy, LoadReadings(1, 0), 0.0, History())
    assert idle.desired == 2 and "warm pool" in idle.reason  # no load: two idle ready ones (min 1 is within them)
    busy = decide(policy, LoadReadings(3, 0, request_rate_rps=6.0), 20.0, History())
    assert busy.desired == 5  # 3 for the load, 2 warm


def test_scale_to_zero_and_back_without_cool_down():
    policy = PolicyView(**{**POLICY.__dict__, "scale_to_zero": True, "scale_to_zero_after_s": 120.0,
                           "warm_pool_size": 1})
    recent = decide(policy, LoadReadings(2, 0, idle_for_s=30.0), 1000.0, History())
    assert recent.desired == 1  # one (the warm pool of one) until idle long enough
    idle = decide(policy, LoadReadings(1, 0, idle_for_s=500.0), 1000.0, History())
    assert idle.action == "scale_down" and idle.desired == 0 and "zero" in idle.reason
    # A request waits in the queue at zero: one starts at once, cool-down or not.
    woken = decide(policy, LoadReadings(0, 0, queue_depth=1, idle_for_s=0.0), 1001.0,
                   History(last_scale_up_at=1000.0))
    assert woken.action == "scale_up" and woken.desired >= 1


def test_forecast_starts_replicas_ahead_of_a_recorded_daily_peak():
    """Day 1 is recorded (a peak of 10 rps from 12:00 to 13:00, 1 rps otherwise); on day 2 the
    predictive autoscaler has the peak's replicas up a load time before 12:00, the reactive one
    only after the load arrived."""
    day, load_s, tick = 86400.0, 600.0, 60.0
    noon = 12 * 3600.0
    samples = []
    for t in range(0, int(day), int(tick)):
        rate = 10.0 if noon <= t < noon + 3600 else 1.0
        samples.append((t + tick, tick, rate * tick))
    profile = build_profile(samples, period_s=day, bin_s=300.0)
    assert profile.rate_at(day + noon + 10) == 10.0

    def replicas_by(predictive: bool, until: float) -> int:
        policy = PolicyView(**{**POLICY.__dict__, "predictive": predictive, "max_replicas": 10})
        loop = Loop(policy, replicas=1)
        t = day + noon - 2 * 3600
        while t <= until:
            actual = 10.0 if day + noon <= t < day + noon + 3600 else 1.0
            forecast = profile.peak(t, t + load_s + 2 * tick)
            loop.tick(t, request_rate_rps=actual, forecast_rps=forecast, load_seconds=load_s)
            t += tick
        return loop.replicas

    # A load time before noon the predictive fleet has already asked for the peak's 5 replicas.
    assert replicas_by(True, day + noon - load_s) == 5
    assert replicas_by(False, day + noon - load_s) == 1
    assert replicas_by(False, day + noon + tick) == 5  # reactive: only once the load is there


def test_profile_bins_and_peak():
    profile = TimeOfDayProfile(period_s=100.0, bin_s=10.0)
    profile.add(15.0, 4.0)
    profile.add(115.0, 6.0)  # same bin, next period
    assert profile.rate_at(12.0) == 5.0
    assert profile.rate_at(55.0) is None
    assert profile.peak(0.0, 30.0) == 5.0
    assert profile.peak(40.0, 60.0) == 0.0


def test_ttft_need_waits_until_the_last_scale_up_settled():
    slow = LoadReadings(3, 0, ttft_p90_s=3.0, ttft_target_s=1.0, ttft_window_s=60.0)
    just_scaled = decide(POLICY, slow, 100.0, History(last_scale_up_at=70.0))
    assert "ttft_p90" not in just_scaled.numbers["needs"] and just_scaled.action != "scale_up"
    settled = decide(POLICY, slow, 100.0, History(last_scale_up_at=30.0))
    assert settled.numbers["needs"]["ttft_p90"] == 4 and settled.action == "scale_up"


def test_scale_down_keeps_headroom_over_the_rate():
    # 3.5 rps on replicas of 2 rps: 2 are needed, but 2 x 2 < 3.5 x 1.25, so 3 stay.
    d = decide(POLICY, LoadReadings(4, 0, request_rate_rps=3.5), 1000.0, History())
    assert d.action == "scale_down" and d.desired == 3 and d.numbers["with_headroom"] == 3


def test_a_lost_replica_is_replaced_within_the_scale_up_cool_down():
    history = History(last_scale_up_at=95.0, last_desired=3)
    # One of three failed (its engine died) 5 s after a scale up: back to three at once.
    d = decide(POLICY, LoadReadings(num_ready=2, num_loading=0, queue_depth=8), 100.0, history)
    assert d.action == "scale_up" and d.desired == 3 and "replaces 1 lost" in d.reason
    # More load than that still waits for the cool-down: a replacement is no scale up.
    d = decide(POLICY, LoadReadings(num_ready=2, num_loading=0, queue_depth=40), 100.0, history)
    assert d.desired == 3
    # The one replica of a min-1 version failed: replaced (from zero, never delayed).
    d = decide(POLICY, LoadReadings(num_ready=0, num_loading=0), 100.0, History(last_scale_up_at=99.0, last_desired=1))
    assert d.action == "scale_up" and d.desired == 1
    # Nothing lost, within the cool-down: hold as before.
    d = decide(POLICY, LoadReadings(num_ready=3, num_loading=0, queue_depth=40), 100.0, history)
    assert d.action == "hold"
