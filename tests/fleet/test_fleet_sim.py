"""The benchmark's fleet simulation, on fixed parameters (no replica): it drives the real
autoscaler, and with a load time longer than the lunch spike's onset the predictive autoscaler
has capacity up before the spike while the reactive one queues."""
from benchmarks.autoscale import main as autoscale_main
from benchmarks.fleet_sim import ReplicaModel, simulate
from fleet.scaling_decision import PolicyView
from fleet.forecast import build_profile


def step_day(t: float) -> float:
    return 8.0 if 600 <= t < 800 else 1.0


def run(predictive: bool, load_s: float = 60.0):
    model = ReplicaModel(load_s=load_s, slots=4, service_s=2.0, ttft_s=0.2, tokens_per_request=60)
    samples = [(t + 5.0, 5.0, step_day(t) * 5.0) for t in range(0, 1200, 5)]
    policy = PolicyView(min_replicas=1, max_replicas=8, predictive=predictive,
                        replica_capacity_rps=1.6, target_queue_depth=2,
                        scale_up_cooldown_s=5.0, scale_down_cooldown_s=60.0)
    return simulate(rate=step_day, day_s=1200.0, model=model, policy=policy,
                    profile=build_profile(samples, 1200.0, 12.5) if predictive else None,
                    is_ramp=lambda t: 600 <= t < 700, tick_s=5.0, max_queue=256, max_wait_s=5.0,
                    seed=3)


def test_predictive_has_replicas_ready_before_the_step_reactive_after():
    reactive, predictive = run(False), run(True)
    ready_at = lambda r, t: next(ready for at, ready, _ in r.timeline if at >= t)  # noqa: E731
    assert ready_at(predictive, 600.0) >= 5
    assert ready_at(reactive, 600.0) < 5  # only what the noise of a 1 req/s trough asked for
    assert max(predictive.ttft_ramp) < max(reactive.ttft_ramp)
    assert reactive.served > 0 and predictive.served > 0
    assert all(action in ("scale_up", "scale_down") for _, action, _, _ in predictive.decisions)


def test_benchmark_writes_both_autoscalers(tmp_path):
    out = tmp_path / "autoscale.json"
    assert autoscale_main(["--no-measure", "--day-minutes", "5", "--out", str(out)]) == 0
    import json

    report = json.loads(out.read_text())
    for name in ("reactive", "predictive"):
        assert {"ttft_p99_ramp_s", "replica_minutes", "refused"} <= set(report[name])
        assert report[name]["served"] > 0
    assert "SIMULATED" in report["note"].upper()
