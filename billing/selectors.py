"""Billing reads."""
from __future__ import annotations

from datetime import datetime
from typing import Iterable

from django.db.models import Sum
from django.db.models.functions import TruncDay, TruncHour

from billing.models import Price, UsageHourly
from billing.pricing import PriceBook, PriceTerms


class MissingPrice(Exception):
    """A model version without a price in effect: it may not serve (nothing is silently free)."""


def require_price(model_version, now: datetime) -> None:
    """Raise MissingPrice unless `model_version` has a price in effect at `now`."""
    if not Price.objects.filter(model_version=model_version, effective_from__lte=now).exists():
        raise MissingPrice(
            f"{model_version} has no price in effect, so it may not serve traffic (its usage "
            f"would be free): set one first, e.g. `python manage.py setprice "
            f"{model_version.model.name} --model-version {model_version.version_number} --input X "
            "--output Y`")

GRANULARITIES = {"hour": TruncHour, "day": TruncDay}


def price_book(model_version_ids: Iterable[int]) -> PriceBook:
    prices = Price.objects.filter(model_version_id__in=set(model_version_ids))
    return PriceBook(
        (p.model_version_id, p.effective_from,
         PriceTerms(p.input_per_million, p.output_per_million, p.cached_input_per_million))
        for p in prices
    )


def usage_series(tenant_id: int, start: datetime, end: datetime, granularity: str) -> list[dict]:
    """The tenant's rolled-up usage in [start, end), one entry per (period, model), oldest
    first. Reads only `tenant_id`'s rows."""
    trunc = GRANULARITIES[granularity]
    rows = (UsageHourly.objects.filter(tenant_id=tenant_id, hour__gte=start, hour__lt=end)
            .annotate(period=trunc("hour")).values("period", "model_name")
            .annotate(num_requests=Sum("num_requests"), input_tokens=Sum("input_tokens"),
                      cached_tokens=Sum("cached_tokens"), output_tokens=Sum("output_tokens"))
            .order_by("period", "model_name"))
    return [
        {"start": row["period"].isoformat(), "model": row["model_name"],
         "num_requests": row["num_requests"], "input_tokens": row["input_tokens"],
         "cached_tokens": row["cached_tokens"], "output_tokens": row["output_tokens"]}
        for row in rows
    ]
