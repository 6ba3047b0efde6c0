"""The evaluator's decisions on fixed evidence (pure)."""
from rollouts.decision import (
    ADVANCE,
    HOLD,
    ROLLBACK,
    Evidence,
    ProbeResult,
    Thresholds,
    VersionStats,
    decide,
)

T = Thresholds(min_requests=20, step_min_s=60, max_error_rate_delta=0.02,
               max_latency_ratio=1.5, latency_slack_ms=10, min_agreement=0.8)
GOOD = VersionStats(num_requests=100, num_failed=1, ttft_p90_ms=200.0, tpot_p90_ms=40.0)
AGREES = ProbeResult(agreement=0.97, exact_match=0.8, num_prompts=5)


def evidence(canary=GOOD, stable=GOOD, probe=AGREES, age=120.0) -> Evidence:
    return Evidence(canary=canary, stable=stable, probe=probe, step_age_s=age)


def test_healthy_canary_advances():
    decision = decide(evidence(), T)
    assert decision.action == ADVANCE, decision.reasons


def test_hold_until_the_step_is_old_enough_and_has_traffic_and_a_probe():
    young = decide(evidence(age=10), T)
    assert young.action == HOLD and "10 s old" in young.reasons[0]
    few = decide(evidence(canary=VersionStats(num_requests=5, ttft_p90_ms=1, tpot_p90_ms=1)), T)
    assert few.action == HOLD and any("canary has 5 of 20" in r for r in few.reasons)
    no_probe = decide(evidence(probe=None), T)
    assert no_probe.action == HOLD and "probe not run" in no_probe.reasons[0]
    failed_probe = decide(evidence(probe=ProbeResult(0, 0, 0, error="no ready canary replica")), T)
    assert failed_probe.action == HOLD and "could not run" in failed_probe.reasons[0]


def test_error_rate_above_stable_rolls_back():
    bad = VersionStats(num_requests=40, num_failed=4, ttft_p90_ms=200.0, tpot_p90_ms=40.0)
    decision = decide(evidence(canary=bad), T)
    assert decision.action == ROLLBACK and "error rate 0.100" in decision.reasons[0]
    # Within the allowed delta of stable's own error rate: not a rollback.
    noisy_stable = VersionStats(num_requests=100, num_failed=10, ttft_p90_ms=200.0, tpot_p90_ms=40.0)
    assert decide(evidence(canary=bad, stable=noisy_stable), T).action == ADVANCE


def test_failures_that_fell_back_to_stable_count_as_canary_errors():
    # Every canary request failed before its first token and was served by stable.
    broken = VersionStats(num_requests=0, num_fallbacks_failed=25)
    decision = decide(evidence(canary=broken), T)
    assert decision.action == ROLLBACK and "25 of 25" in decision.reasons[0]
    # Too few attempts yet: hold, whatever the rate.
    assert decide(evidence(canary=VersionStats(num_fallbacks_failed=3)), T).action == HOLD


def test_no_ready_canary_replica_is_not_an_error():
    unavailable = VersionStats(num_requests=0, num_fallbacks_unavailable=500)
    decision = decide(evidence(canary=unavailable), T)
    assert decision.action == HOLD


def test_probe_disagreement_rolls_back_even_before_traffic():
    garbage = ProbeResult(agreement=0.1, exact_match=0.0, num_prompts=5)
    decision = decide(evidence(canary=VersionStats(), probe=garbage, age=0), T)
    assert decision.action == ROLLBACK and "agreement 0.100 < 0.8" in decision.reasons[0]


def test_latency_regressions_roll_back():
    slow_ttft = VersionStats(num_requests=100, ttft_p90_ms=400.0, tpot_p90_ms=40.0)
    slow_tpot = VersionStats(num_requests=100, ttft_p90_ms=200.0, tpot_p90_ms=90.0)
    assert decide(evidence(canary=slow_ttft), T).action == ROLLBACK
    decision = decide(evidence(canary=slow_tpot), T)
    assert decision.action == ROLLBACK and "TPOT" in decision.reasons[0]
    # Within ratio x stable + slack: fine (200 x 1.5 + 10 = 310).
    ok = VersionStats(num_requests=100, ttft_p90_ms=305.0, tpot_p90_ms=60.0)
    assert decide(evidence(canary=ok), T).action == ADVANCE


def test_latency_is_not_judged_on_too_few_requests():
    slow_few = VersionStats(num_requests=5, ttft_p90_ms=5000.0, tpot_p90_ms=900.0)
    assert decide(evidence(canary=slow_few), T).action == HOLD


def test_evidence_json_has_rates():
    data = evidence().to_json()
    assert data["canary"]["error_rate"] == 0.01 and data["canary"]["num_attempts"] == 100
    assert data["probe"]["agreement"] == 0.97
