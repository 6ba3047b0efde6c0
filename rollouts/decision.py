"""What the evaluator does with a rollout given its evidence: pure, no Django, no clock.

`decide(evidence, thresholds)` -> Decision(action, reasons). Rules, in order:
1. rollback when the canary's error rate exceeds stable's by more than `max_error_rate_delta`
   (needs `min_requests` canary attempts; attempts include requests that fell back to stable
   because a canary replica failed before the first token);
2. rollback when the quality probe ran this step and its agreement is below `min_agreement`;
3. rollback when the canary's TTFT p90 or TPOT p90 exceeds stable's x `max_latency_ratio`
   + `latency_slack_ms` (needs `min_requests` successful requests on both sides);
4. advance when the step is at least `step_min_s` old, both versions have `min_requests`
   requests in it, and the probe passed this step;
5. otherwise hold (the reasons say what is missing).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class VersionStats:
    """One version's requests in the evaluation window."""

    num_requests: int = 0  # ok + failed (client cancels and rejected inputs excluded)
    num_failed: int = 0
    num_fallbacks_failed: int = 0  # canary only: failed before the first token, served by stable
    num_fallbacks_unavailable: int = 0  # canary only: no ready replica / full queue
    ttft_p90_ms: float | None = None
    tpot_p90_ms: float | None = None

    @property
    def num_attempts(self) -> int:
        return self.num_requests + self.num_fallbacks_failed

    @property
    def num_ok(self) -> int:
        return self.num_requests - self.num_failed

    @property
    def error_rate(self) -> float | None:
        if self.num_attempts == 0:
            return None
        return (self.num_failed + self.num_fallbacks_failed) / self.num_attempts


@dataclass(frozen=True)
class ProbeResult:
    agreement: float  # mean over prompts of common-prefix length / longer answer's length
    exact_match: float  # fraction of prompts whose answers are identical
    num_prompts: int
    samples: list[dict] = field(default_factory=list)  # per prompt: prompt, stable, canary, score
    error: str = ""  # non-empty: the probe could not run (no ready replica, ...)

    @property
    def ran(self) -> bool:
        return not self.error and self.num_prompts > 0


@dataclass(frozen=True)
class Thresholds:
    min_requests: int = 50
    step_min_s: float = 300.0
    max_error_rate_delta: float = 0.02
    max_latency_ratio: float = 1.5
    latency_slack_ms: float = 25.0
    min_agreement: float = 0.8


@dataclass(frozen=True)
class Evidence:
    canary: VersionStats
    stable: VersionStats
    probe: ProbeResult | None  # None: not run yet this step
    step_age_s: float

    def to_json(self) -> dict:
        data = asdict(self)
        for side in ("canary", "stable"):
            stats: VersionStats = getattr(self, side)
            data[side]["error_rate"] = stats.error_rate
            data[side]["num_attempts"] = stats.num_attempts
        return data


HOLD, ADVANCE, ROLLBACK = "hold", "advance", "rollback"


@dataclass(frozen=True)
class Decision:
    action: str  # hold | advance | rollback
    reasons: tuple[str, ...]


def _latency_regression(name: str, canary: float | None, stable: float | None,
                        t: Thresholds) -> str | None:
    if canary is None or stable is None:
        return None
    limit = stable * t.max_latency_ratio + t.latency_slack_ms
    if canary > limit:
        return (f"canary {name} p90 {canary:.1f} ms > stable {stable:.1f} ms x "
                f"{t.max_latency_ratio:g} + {t.latency_slack_ms:g} ms")
    return None


def decide(evidence: Evidence, t: Thresholds) -> Decision:
    canary, stable, probe = evidence.canary, evidence.stable, evidence.probe

    if canary.num_attempts >= t.min_requests and canary.error_rate is not None:
        stable_rate = stable.error_rate or 0.0
        if canary.error_rate > stable_rate + t.max_error_rate_delta:
            return Decision(ROLLBACK, (
                f"canary error rate {canary.error_rate:.3f} > stable {stable_rate:.3f} + "
                f"{t.max_error_rate_delta:g} ({canary.num_failed + canary.num_fallbacks_failed} "
                f"of {canary.num_attempts} attempts failed)",))

    if probe is not None and probe.ran and probe.agreement < t.min_agreement:
        return Decision(ROLLBACK, (
            f"quality probe agreement {probe.agreement:.3f} < {t.min_agreement:g} "
            f"(exact match {probe.exact_match:.2f} over {probe.num_prompts} prompts)",))

    if canary.num_ok >= t.min_requests and stable.num_ok >= t.min_requests:
        regressions = [r for r in (
            _latency_regression("TTFT", canary.ttft_p90_ms, stable.ttft_p90_ms, t),
            _latency_regression("TPOT", canary.tpot_p90_ms, stable.tpot_p90_ms, t),
        ) if r]
        if regressions:
            return Decision(ROLLBACK, tuple(regressions))

    waiting = []
    if evidence.step_age_s < t.step_min_s:
        waiting.append(f"step is {evidence.step_age_s:.0f} s old, needs {t.step_min_s:g} s")
    if canary.num_requests < t.min_requests:
        waiting.append(f"canary has {canary.num_requests} of {t.min_requests} requests")
    if stable.num_requests < t.min_requests:
        waiting.append(f"stable has {stable.num_requests} of {t.min_requests} requests")
    if probe is None:
        waiting.append("quality probe not run this step")
    elif not probe.ran:
        waiting.append(f"quality probe could not run: {probe.error}")
    if waiting:
        return Decision(HOLD, tuple(waiting))
    return Decision(ADVANCE, (
        f"canary within thresholds over {canary.num_requests} requests "
        f"(stable {stable.num_requests}); probe agreement {probe.agreement:.3f}",))
