"""Usage over time per model (tokens, requests, TTFT p50/p90) and consumption against quotas."""
import time
from datetime import datetime, timezone

from django.shortcuts import render

from dashboard.access import member_view
from dashboard.charts import Series, line_chart, period_label
from dashboard.selectors import DEFAULT_RANGE, RANGES, periods, totals_since, usage_points
from tenants.consumption import consumption_for
from tenants.selectors import limits_from_tenant


def build_charts(points, xs: list[datetime], granularity: str) -> list:
    index = {p: i for i, p in enumerate(xs)}
    models = sorted({p.model for p in points})
    blank = {m: [0.0] * len(xs) for m in models}
    tokens = {m: list(v) for m, v in blank.items()}
    requests = {m: list(v) for m, v in blank.items()}
    p50 = {m: [None] * len(xs) for m in models}
    p90 = {m: [None] * len(xs) for m in models}
    for p in points:
        i = index.get(p.period)
        if i is None:
            continue
        tokens[p.model][i] = p.num_tokens
        requests[p.model][i] = p.num_requests
        p50[p.model][i] = p.ttft_p50_ms
        p90[p.model][i] = p.ttft_p90_ms
    labels = [period_label(x, granularity) for x in xs]
    ttft = [Series(f"{m} p50", p50[m]) for m in models] + [Series(f"{m} p90", p90[m])
                                                           for m in models]
    return [
        line_chart("chart-tokens", "Tokens (input + output)", "tokens", labels,
                   [Series(m, tokens[m]) for m in models]),
        line_chart("chart-requests", "Requests", "requests", labels,
                   [Series(m, requests[m]) for m in models]),
        line_chart("chart-ttft", "Time to first token, p50 and p90", "ms", labels, ttft),
    ]


def model_totals(points) -> list[dict]:
    totals: dict[str, dict] = {}
    for p in points:
        t = totals.setdefault(p.model, {"model": p.model, "requests": 0, "tokens": 0})
        t["requests"] += p.num_requests
        t["tokens"] += p.num_tokens
    return sorted(totals.values(), key=lambda t: t["model"])


@member_view
def overview(request):
    tenant = request.tenant
    usage_range = RANGES.get(request.GET.get("range", ""), RANGES[DEFAULT_RANGE])
    now = datetime.now(timezone.utc)
    xs = periods(usage_range, now)
    points = usage_points(tenant.pk, xs[0], xs[-1] + usage_range.step, usage_range.granularity)
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    context = {
        "tenant": tenant,
        "ranges": RANGES.values(),
        "range": usage_range,
        "charts": build_charts(points, xs, usage_range.granularity),
        "totals": model_totals(points),
        "limits": limits_from_tenant(tenant),
        "consumption": consumption_for([tenant]).get(tenant.pk),
        "month": totals_since(tenant.pk, month_start),
        "month_start": month_start,
        "generated_at": time.time(),
    }
    return render(request, "dashboard/overview.html", context)
