"""Prices by effective date, hourly roll-ups, monthly invoices (exact Decimal, immutable,
late events as corrections), and the property: invoice total = sum of tokens x price in
effect at each event's time."""
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from billing.invoicing import issue_invoice, issue_invoices, month_bounds
from billing.models import Invoice, InvoiceLine, UsageHourly, UsageRecord
from billing.pricing import PriceTerms
from billing.rollups import rollup_usage
from billing.services import set_price, write_usage
from tenants.services import create_api_key, create_tenant
from tests.support.billing import event

pytestmark = pytest.mark.django_db(transaction=True)

UTC = timezone.utc
MARCH = datetime(2026, 3, 1, tzinfo=UTC)
APRIL = datetime(2026, 4, 1, tzinfo=UTC)
MAY = datetime(2026, 5, 1, tzinfo=UTC)


def at(moment: datetime) -> float:
    return moment.timestamp()


def test_price_change_applies_from_its_date(account, model_version):
    tenant, key = account
    set_price(model_version, MARCH, "1.5", "6", cached_input_per_million="0.5")
    set_price(model_version, MARCH + timedelta(days=10), "2", "8")
    write_usage([
        event(tenant.pk, key.pk, model_version.pk, input_tokens=1000, cached_tokens=400,
              output_tokens=100, occurred_at=at(MARCH + timedelta(days=9, hours=23))),
        event(tenant.pk, key.pk, model_version.pk, input_tokens=1000, cached_tokens=400,
              output_tokens=100, occurred_at=at(MARCH + timedelta(days=10))),
    ])
    invoice = issue_invoice(tenant.pk, MARCH, APRIL, now=APRIL)
    # 600 x 1.5 + 400 x 0.5 + 100 x 6 = 1700; then 1000 x 2 + 100 x 8 = 2800 (per million)
    assert invoice.total == Decimal("0.0045")
    line = invoice.lines.get()
    assert (line.kind, line.num_requests, line.input_tokens, line.output_tokens) == \
        ("usage", 2, 2000, 200)


def test_issued_invoices_never_change_and_late_events_are_corrections(account, model_version):
    tenant, key = account
    set_price(model_version, MARCH, "1", "2")
    write_usage([event(tenant.pk, key.pk, model_version.pk, input_tokens=10**6,
                       output_tokens=0, occurred_at=at(MARCH + timedelta(days=3)))])
    [march] = issue_invoices(now=APRIL + timedelta(hours=1))
    assert march.total == Decimal(1)
    # A March event arrives after March was invoiced, and an April one.
    write_usage([
        event(tenant.pk, key.pk, model_version.pk, input_tokens=0, output_tokens=10**6,
              occurred_at=at(MARCH + timedelta(days=30))),
        event(tenant.pk, key.pk, model_version.pk, input_tokens=3 * 10**6, output_tokens=0,
              occurred_at=at(APRIL + timedelta(days=1))),
    ])
    assert issue_invoices(now=APRIL + timedelta(hours=2)) == [march]  # idempotent
    march.refresh_from_db()
    assert march.total == Decimal(1) and march.lines.count() == 1
    with pytest.raises(ValueError):
        march.save()
    with pytest.raises(ValueError):
        march.lines.get().save()
    [april] = issue_invoices(now=MAY)
    lines = {(line.kind, line.model_name): line.amount for line in april.lines.all()}
    assert lines == {("usage", "chat-small"): Decimal(3), ("correction", "chat-small"): Decimal(2)}
    assert april.total == Decimal(5)
    assert not UsageRecord.objects.filter(invoice__isnull=True).exists()


def test_hourly_rollup_recomputes_late_hours(account, model_version):
    tenant, key = account
    ten = MARCH + timedelta(hours=10)
    write_usage([event(tenant.pk, key.pk, model_version.pk, occurred_at=at(ten + timedelta(minutes=m)))
                 for m in (1, 30, 59)] +
                [event(tenant.pk, key.pk, model_version.pk, occurred_at=at(ten + timedelta(hours=1)))])
    now = datetime.now(UTC)
    rollup_usage(now, timedelta(hours=1))
    hours = {h.hour: (h.num_requests, h.input_tokens, h.output_tokens)
             for h in UsageHourly.objects.filter(tenant=tenant)}
    assert hours == {ten: (3, 30, 15), ten + timedelta(hours=1): (1, 10, 5)}
    write_usage([event(tenant.pk, key.pk, model_version.pk, occurred_at=at(ten + timedelta(minutes=5)))])
    rollup_usage(datetime.now(UTC), timedelta(hours=1))
    rollup_usage(datetime.now(UTC), timedelta(hours=1))  # idempotent
    assert UsageHourly.objects.get(tenant=tenant, hour=ten).num_requests == 4


price_st = st.tuples(
    st.integers(min_value=-20, max_value=40),  # effective day offset from March 1st
    st.decimals(min_value=0, max_value=100, places=6),
    st.decimals(min_value=0, max_value=100, places=6),
    st.one_of(st.none(), st.decimals(min_value=0, max_value=100, places=6)),
)
event_st = st.tuples(
    st.integers(min_value=0, max_value=31 * 24 * 3600 - 1),  # second of March
    st.integers(min_value=0, max_value=200_000),
    st.integers(min_value=0, max_value=200_000),
    st.integers(min_value=0, max_value=50_000),
)


@hsettings(max_examples=25, deadline=None,
           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(prices=st.lists(price_st, min_size=0, max_size=4, unique_by=lambda p: p[0]),
       events=st.lists(event_st, min_size=1, max_size=30))
def test_invoice_total_is_tokens_times_price_in_effect(model_version, prices, events):
    tenant = create_tenant(f"t-{Invoice.objects.count()}-{UsageRecord.objects.count()}",
                           "standard")
    key = create_api_key(tenant).api_key
    # Every example its own model version, so prices of earlier examples do not leak in.
    from models_registry.services import ensure_model_version

    version = ensure_model_version("chat-small", 100 + tenant.pk, "fake", tokenizer="bytes")
    for day, input_price, output_price, cached_price in prices:
        set_price(version, MARCH + timedelta(days=day), input_price, output_price, cached_price)
    write_usage([event(tenant.pk, key.pk, version.pk, input_tokens=num_in,
                       cached_tokens=min(num_cached, num_in), output_tokens=num_out,
                       occurred_at=at(MARCH + timedelta(seconds=second)))
                 for second, num_in, num_cached, num_out in events])
    invoice = issue_invoice(tenant.pk, *month_bounds(MARCH), now=APRIL)

    expected = Decimal(0)
    for second, num_in, num_cached, num_out in events:
        moment = MARCH + timedelta(seconds=second)
        in_effect = [p for p in prices if MARCH + timedelta(days=p[0]) <= moment]
        if not in_effect:
            continue  # no price yet: free
        _, input_price, output_price, cached_price = max(in_effect, key=lambda p: p[0])
        cached = min(num_cached, num_in)
        cached_price = input_price if cached_price is None else cached_price
        expected += ((num_in - cached) * input_price + cached * cached_price
                     + num_out * output_price) / Decimal(10**6)
    assert invoice.total == expected
    assert sum(line.amount for line in invoice.lines.all()) == invoice.total
    assert sum(line.num_requests for line in invoice.lines.all()) == len(events)


def test_cost_is_exact():
    terms = PriceTerms(Decimal("0.15"), Decimal("0.6"), Decimal("0.075"))
    assert terms.cost(1, 0, 0) == Decimal("0.00000015")
    assert terms.cost(3, 1, 7) == Decimal("2") * Decimal("0.15") / 10**6 + \
        Decimal("0.075") / 10**6 + 7 * Decimal("0.6") / 10**6


def test_setprice_command(model_version):
    import io

    from django.core.management import call_command

    from billing.models import Price

    out = io.StringIO()
    call_command("setprice", "chat-small", "--input", "0.15", "--output", "0.6",
                 "--cached-input", "0.075", "--from", "2026-03-01T00:00:00", stdout=out)
    price = Price.objects.get()
    assert (price.effective_from, price.cached_input_per_million) == (MARCH, Decimal("0.075"))


def test_beat_tasks_run(account, model_version):
    from billing.tasks import issue_invoices_task, rollup_usage_task

    tenant, key = account
    last_month = datetime.now(UTC).replace(day=1) - timedelta(days=3)
    write_usage([event(tenant.pk, key.pk, model_version.pk, occurred_at=at(last_month))])
    assert rollup_usage_task() == 1
    [invoice_id] = issue_invoices_task()
    assert Invoice.objects.get(pk=invoice_id).lines.get().num_requests == 1
    assert issue_invoices_task() == []  # nothing left to bill


@hsettings(max_examples=20, deadline=None,
           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(events=st.lists(st.tuples(event_st, st.booleans()), min_size=1, max_size=30),
       input_price=st.decimals(min_value=0, max_value=100, places=6),
       output_price=st.decimals(min_value=0, max_value=100, places=6))
def test_late_events_are_billed_once_on_the_next_invoice(model_version, events, input_price,
                                                         output_price):
    """Events arrive on time or late (after March was invoiced): March's total plus April's
    correction lines bill every March event exactly once, and March never changes."""
    tenant = create_tenant(f"late-{Invoice.objects.count()}-{UsageRecord.objects.count()}",
                           "standard")
    key = create_api_key(tenant).api_key
    from models_registry.services import ensure_model_version

    version = ensure_model_version("chat-small", 1000 + tenant.pk, "fake", tokenizer="bytes")
    set_price(version, MARCH, input_price, output_price)
    terms = PriceTerms(input_price, output_price)

    def as_event(spec):
        second, num_in, num_cached, num_out = spec
        return event(tenant.pk, key.pk, version.pk, input_tokens=num_in,
                     cached_tokens=min(num_cached, num_in), output_tokens=num_out,
                     occurred_at=at(MARCH + timedelta(seconds=second)))

    on_time = [as_event(spec) for spec, late in events if not late]
    late = [as_event(spec) for spec, late in events if late]
    write_usage(on_time)
    march = issue_invoice(tenant.pk, MARCH, APRIL, now=APRIL)
    march_total = march.total if march else Decimal(0)
    write_usage(late + on_time)  # late ones, and redeliveries of the on-time ones
    april = issue_invoice(tenant.pk, APRIL, MAY, now=MAY)
    corrections = Decimal(0) if april is None else sum(
        (line.amount for line in april.lines.filter(kind="correction")), Decimal(0))
    expected = sum((terms.cost(e.input_tokens, e.cached_tokens, e.output_tokens)
                    for e in on_time + late), Decimal(0))
    assert march_total + corrections == expected
    if march is not None:
        march.refresh_from_db()
        assert march.total == march_total
