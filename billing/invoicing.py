"""Monthly invoices: one per tenant and calendar month (UTC), a line per model, exact Decimal.

An invoice bills every not-yet-invoiced, finalised usage row of the tenant that occurred before
the end of its period (a pending row waits for its finalisation): rows of the period itself are
`usage` lines; rows of earlier periods (they arrived or were finalised after those periods were
invoiced) are `correction` lines. Each billed row points at its
invoice, so no row is ever billed twice and issued invoices never change.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from django.db import transaction

from billing.models import Invoice, InvoiceLine, UsageRecord
from billing.selectors import price_book

_CHUNK = 5000


def month_bounds(moment: datetime) -> tuple[datetime, datetime]:
    start = moment.astimezone(timezone.utc).replace(day=1, hour=0, minute=0, second=0,
                                                    microsecond=0)
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 \
        else start.replace(month=start.month + 1)
    return start, end


def previous_month(now: datetime) -> tuple[datetime, datetime]:
    this_start, _ = month_bounds(now)
    return month_bounds(this_start - timedelta(days=1))


@dataclass
class _LineTotals:
    num_requests: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    amount: Decimal = Decimal(0)


def issue_invoice(tenant_id: int, period_start: datetime, period_end: datetime,
                  now: datetime) -> Invoice | None:
    """Issue the tenant's invoice for [period_start, period_end); idempotent (returns the
    existing one). None when there is nothing to bill."""
    with transaction.atomic():
        existing = Invoice.objects.filter(tenant_id=tenant_id, period_start=period_start).first()
        if existing is not None:
            return existing
        rows = list(UsageRecord.objects.select_for_update()
                    .filter(tenant_id=tenant_id, invoice__isnull=True,
                            occurred_at__lt=period_end)
                    .exclude(status=UsageRecord.Status.PENDING)
                    .values_list("id", "model_name", "model_version_id", "occurred_at",
                                 "input_tokens", "cached_tokens", "output_tokens"))
        if not rows:
            return None
        book = price_book({row[2] for row in rows})
        lines: dict[tuple[str, str], _LineTotals] = {}
        for _, model_name, version_id, occurred_at, num_in, num_cached, num_out in rows:
            kind = (InvoiceLine.Kind.USAGE if occurred_at >= period_start
                    else InvoiceLine.Kind.CORRECTION)
            line = lines.setdefault((kind, model_name), _LineTotals())
            line.num_requests += 1
            line.input_tokens += num_in
            line.cached_tokens += num_cached
            line.output_tokens += num_out
            line.amount += book.at(version_id, occurred_at).cost(num_in, num_cached, num_out)
        invoice = Invoice.objects.create(
            tenant_id=tenant_id, period_start=period_start, period_end=period_end,
            issued_at=now, total=sum((line.amount for line in lines.values()), Decimal(0)))
        InvoiceLine.objects.bulk_create([
            InvoiceLine(invoice=invoice, kind=kind, model_name=model_name,
                        num_requests=t.num_requests, input_tokens=t.input_tokens,
                        cached_tokens=t.cached_tokens, output_tokens=t.output_tokens,
                        amount=t.amount)
            for (kind, model_name), t in sorted(lines.items())
        ])
        ids = [row[0] for row in rows]
        for i in range(0, len(ids), _CHUNK):
            UsageRecord.objects.filter(id__in=ids[i:i + _CHUNK]).update(invoice=invoice)
        return invoice


def issue_invoices(now: datetime) -> list[Invoice]:
    """Last month's invoice for every tenant with unbilled usage up to its end."""
    period_start, period_end = previous_month(now)
    tenant_ids = (UsageRecord.objects.filter(invoice__isnull=True, occurred_at__lt=period_end)
                  .exclude(status=UsageRecord.Status.PENDING)
                  .values_list("tenant_id", flat=True).distinct())
    issued = []
    for tenant_id in sorted(set(tenant_ids)):
        invoice = issue_invoice(tenant_id, period_start, period_end, now)
        if invoice is not None:
            issued.append(invoice)
    return issued
