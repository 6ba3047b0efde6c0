"""Reads for the tenant dashboard. Every function takes the tenant's id and reads only its rows."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from django.db.models import Case, F, FloatField, Q, Sum, When
from django.db.models.functions import Trunc

from billing.models import Invoice, UsageHourly
from dashboard.live_usage import live_rows, live_start
from models_registry.models import Model, ModelVersion
from tenants.models import ApiKey


@dataclass(frozen=True)
class UsageRange:
    key: str
    label: str
    span: timedelta
    granularity: str  # "hour" | "day"

    @property
    def step(self) -> timedelta:
        return timedelta(hours=1) if self.granularity == "hour" else timedelta(days=1)


RANGES = {r.key: r for r in [
    UsageRange("24h", "Last 24 hours", timedelta(hours=24), "hour"),
    UsageRange("7d", "Last 7 days", timedelta(days=7), "hour"),
    UsageRange("30d", "Last 30 days", timedelta(days=30), "day"),
    UsageRange("365d", "Last 365 days", timedelta(days=365), "day"),
]}
DEFAULT_RANGE = "7d"


def periods(usage_range: UsageRange, now: datetime) -> list[datetime]:
    """The x positions: every period start from now - span up to the current period."""
    end = now.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)
    if usage_range.granularity == "day":
        end = end.replace(hour=0)
    count = int(usage_range.span / usage_range.step)
    return [end - usage_range.step * i for i in range(count - 1, -1, -1)]


@dataclass(frozen=True)
class UsagePoint:
    period: datetime
    model: str
    num_requests: int
    num_tokens: int  # input + output
    ttft_p50_ms: float | None  # request-weighted mean of the hours' p50 (exact for one hour)
    ttft_p90_ms: float | None


def usage_points(tenant_id: int, start: datetime, end: datetime,
                 granularity: str, now: datetime | None = None) -> list[UsagePoint]:
    """Usage of [start, end) grouped by period and model, oldest first: roll-ups for the older
    hours, the usage rows themselves for the latest ones (live_usage)."""
    now = now or datetime.now(timezone.utc)
    live_from = live_start(now)
    rolled_end = min(end, live_from)
    rows = (UsageHourly.objects.filter(tenant_id=tenant_id, hour__gte=start, hour__lt=rolled_end)
            .annotate(period=Trunc("hour", granularity, tzinfo=timezone.utc))
            .values("period", "model_name")
            .annotate(
                requests=Sum("num_requests"),
                tokens=Sum(F("input_tokens") + F("output_tokens")),
                ttft_weight=Sum(Case(When(ttft_p50_ms__isnull=False, then=F("num_requests")),
                                     default=0)),
                p50_sum=Sum(F("ttft_p50_ms") * F("num_requests"), output_field=FloatField()),
                p90_sum=Sum(F("ttft_p90_ms") * F("num_requests"), output_field=FloatField()))
            .order_by("period", "model_name"))
    points = []
    for row in rows:
        weight = row["ttft_weight"] or 0
        points.append(UsagePoint(
            period=row["period"], model=row["model_name"], num_requests=row["requests"] or 0,
            num_tokens=row["tokens"] or 0,
            ttft_p50_ms=row["p50_sum"] / weight if weight and row["p50_sum"] is not None
            else None,
            ttft_p90_ms=row["p90_sum"] / weight if weight and row["p90_sum"] is not None
            else None))
    if live_from < end:
        rows = [row for row in live_rows(tenant_id, now) if start <= row["hour"] < end]
        points = _with_live_hours(points, rows, granularity)
    return points


def _period_of(hour: datetime, granularity: str) -> datetime:
    return hour.replace(hour=0) if granularity == "day" else hour


def _with_live_hours(points: list[UsagePoint], rows: list[dict],
                     granularity: str) -> list[UsagePoint]:
    """Add the live hours' rows to their periods (a period already holding other hours is
    merged: sums added, TTFT percentiles weighted by requests, as across roll-up hours)."""
    by_key = {(p.period, p.model): p for p in points}
    for row in rows:
        period = _period_of(row["hour"], granularity)
        live = UsagePoint(period=period, model=row["model_name"], num_requests=row["requests"],
                          num_tokens=row["input_tokens"] + row["output_tokens"],
                          ttft_p50_ms=row["ttft_p50_ms"], ttft_p90_ms=row["ttft_p90_ms"])
        earlier = by_key.get((period, live.model))
        by_key[(period, live.model)] = live if earlier is None else _merge(earlier, live)
    return sorted(by_key.values(), key=lambda p: (p.period, p.model))


def _merge(a: UsagePoint, b: UsagePoint) -> UsagePoint:
    def mean(x: float | None, wx: int, y: float | None, wy: int) -> float | None:
        pairs = [(v, w) for v, w in ((x, wx), (y, wy)) if v is not None and w]
        total = sum(w for _, w in pairs)
        return sum(v * w for v, w in pairs) / total if total else None

    return UsagePoint(period=a.period, model=a.model,
                      num_requests=a.num_requests + b.num_requests,
                      num_tokens=a.num_tokens + b.num_tokens,
                      ttft_p50_ms=mean(a.ttft_p50_ms, a.num_requests, b.ttft_p50_ms, b.num_requests),
                      ttft_p90_ms=mean(a.ttft_p90_ms, a.num_requests, b.ttft_p90_ms, b.num_requests))


@dataclass(frozen=True)
class PeriodTotals:
    num_requests: int
    input_tokens: int
    output_tokens: int


def totals_since(tenant_id: int, start: datetime, now: datetime | None = None) -> PeriodTotals:
    """Totals from `start` (an hour boundary) to now: roll-ups for the older hours, the usage
    rows for the latest ones (live_usage)."""
    now = now or datetime.now(timezone.utc)
    row = UsageHourly.objects.filter(tenant_id=tenant_id, hour__gte=start,
                                     hour__lt=live_start(now)).aggregate(
        r=Sum("num_requests"), i=Sum("input_tokens"), o=Sum("output_tokens"))
    totals = PeriodTotals(row["r"] or 0, row["i"] or 0, row["o"] or 0)
    live = [r for r in live_rows(tenant_id, now) if r["hour"] >= start]
    return PeriodTotals(totals.num_requests + sum(r["requests"] for r in live),
                        totals.input_tokens + sum(r["input_tokens"] for r in live),
                        totals.output_tokens + sum(r["output_tokens"] for r in live))


def visible_keys(tenant_id: int):
    """The tenant's keys a member may see and revoke (not the playground's internal key)."""
    return ApiKey.objects.filter(tenant_id=tenant_id, is_internal=False).order_by("-created_at")


def tenant_invoices(tenant_id: int):
    return Invoice.objects.filter(tenant_id=tenant_id).order_by("-period_start")


def playground_models(tenant_id: int) -> list[str]:
    """Names of the models this tenant may call that have an active version."""
    return list(Model.objects.filter(Q(is_public=True) | Q(tenants__id=tenant_id),
                                     versions__state=ModelVersion.State.ACTIVE)
                .distinct().order_by("name").values_list("name", flat=True))
