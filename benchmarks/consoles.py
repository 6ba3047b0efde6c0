"""python -m benchmarks.consoles [--tenants 100] [--days 365] [--runs 10] [--out FILE.json]:
server time of every console and dashboard page with a year of hourly usage for 100 tenants.

Seeds a fresh `llm_platform_bench_consoles` database: `--tenants` tenants x `--days` x 24
hourly roll-up rows (876,000 by default, bulk_create), a monthly invoice per tenant, keys,
members, 20 replicas; then times each page in-process (Django's test client, logged in as an
account manager or a member): one warm-up, then `--runs` requests; median and max in ms. The
target is every page under 300 ms. PostgreSQL and Redis as `make serve` finds them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.django_env import setup_django  # noqa: E402

TARGET_MS = 300.0
BATCH = 10_000


def seed_rollups(tenant_ids, versions, end: datetime, num_hours: int) -> int:
    """`num_hours` hourly roll-ups ending at `end` for each tenant and version (bulk_create)."""
    from billing.models import UsageHourly

    last = end.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)
    rows, total = [], 0
    for tenant_id in tenant_ids:
        for version in versions:
            for h in range(num_hours):
                n = 5 + (h * 7 + tenant_id) % 40
                rows.append(UsageHourly(
                    tenant_id=tenant_id, model_version=version, model_name=version.model.name,
                    hour=last - timedelta(hours=h), num_requests=n, input_tokens=n * 120,
                    cached_tokens=n * 30, output_tokens=n * 40,
                    ttft_p50_ms=80.0 + (h % 24) * 3, ttft_p90_ms=200.0 + (h % 24) * 5))
                if len(rows) >= BATCH:
                    UsageHourly.objects.bulk_create(rows)
                    total += len(rows)
                    rows = []
    if rows:
        UsageHourly.objects.bulk_create(rows)
        total += len(rows)
    return total


def recreate_database(database_url: str) -> None:
    import psycopg

    parsed = urlparse(database_url)
    name = parsed.path.lstrip("/")
    admin = parsed._replace(path="/postgres").geturl().replace("postgres://", "postgresql://", 1)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def seed(num_tenants: int, num_days: int) -> dict:
    from django.contrib.auth.models import Group, User
    from django.db import connection

    from billing.invoicing import month_bounds
    from billing.models import Invoice, InvoiceLine
    from consoles.roles import ACCOUNT_MANAGER
    from models_registry.services import ensure_model_version, register_replica
    from tenants.models import Tenant
    from tenants.services import add_member, create_api_key, ensure_tier

    tier = ensure_tier("standard")
    tenants = Tenant.objects.bulk_create(
        [Tenant(name=f"tenant-{i:03d}", tier=tier) for i in range(num_tenants)])
    version = ensure_model_version("chat-small", 1, "fake", tokenizer="bytes")
    for i in range(20):
        register_replica(version, f"10.0.0.{i}:8001", node_name=f"node-{i % 5}",
                         state="ready" if i % 4 else "loading")
    now = datetime.now(timezone.utc)
    started = time.perf_counter()
    num_rows = seed_rollups([t.pk for t in tenants], [version], now, num_days * 24)
    seed_s = time.perf_counter() - started
    invoices, lines = [], []
    month_start, _ = month_bounds(now)
    for t in tenants:
        start = month_start
        for _ in range(12):
            start, end = month_bounds(start - timedelta(days=1))
            invoices.append(Invoice(tenant=t, period_start=start, period_end=end,
                                    issued_at=end, total=Decimal("12.5")))
    Invoice.objects.bulk_create(invoices)
    for inv in invoices:
        lines.append(InvoiceLine(invoice=inv, kind="usage", model_name="chat-small",
                                 num_requests=1000, input_tokens=120_000, cached_tokens=0,
                                 output_tokens=40_000, amount=Decimal("12.5")))
    InvoiceLine.objects.bulk_create(lines)
    for t in tenants[:10]:
        for _ in range(3):
            create_api_key(t, "bench")
    member = User.objects.create_user("member", password="pw")
    add_member(member, tenants[0])
    manager = User.objects.create_user("manager", password="pw", is_staff=True)
    manager.groups.add(Group.objects.get(name=ACCOUNT_MANAGER))
    operator = User.objects.create_superuser("operator", password="pw")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return {"tenants": tenants, "invoice": invoices[0], "member": member, "manager": manager,
            "operator": operator, "num_rows": num_rows, "seed_s": seed_s}


def time_pages(data: dict, runs: int) -> dict:
    from django.test import Client

    clients = {}
    for role in ("member", "manager", "operator"):
        clients[role] = Client()
        clients[role].force_login(data[role])
    t0, inv = data["tenants"][0], data["invoice"]
    pages = [
        ("member", "/dashboard/?range=24h"), ("member", "/dashboard/?range=7d"),
        ("member", "/dashboard/?range=30d"), ("member", "/dashboard/?range=365d"),
        ("member", "/dashboard/keys/"), ("member", "/dashboard/invoices/"),
        ("member", f"/dashboard/invoices/{inv.pk}/"),
        ("member", f"/dashboard/invoices/{inv.pk}/download/"),
        ("member", "/dashboard/playground/"),
        ("manager", "/admin/"), ("manager", "/admin/tenants/tenant/"),
        ("manager", f"/admin/tenants/tenant/{t0.pk}/change/"),
        ("manager", "/admin/tenants/apikey/"),
        ("manager", "/admin/billing/usagehourly/"),
        ("manager", f"/admin/billing/usagehourly/?tenant__id__exact={t0.pk}"),
        ("manager", "/admin/billing/usagerecord/"), ("manager", "/admin/billing/invoice/"),
        ("manager", f"/admin/billing/invoice/{inv.pk}/change/"),
        ("operator", "/admin/fleet/"), ("operator", "/admin/models_registry/replica/"),
        ("operator", "/admin/models_registry/modelversion/"),
    ]
    results = {}
    for role, url in pages:
        client = clients[role]
        timings = []
        for i in range(runs + 1):
            started = time.perf_counter()
            response = client.get(url)
            if response.streaming:
                b"".join(response.streaming_content)
            elapsed = (time.perf_counter() - started) * 1000
            if response.status_code != 200:
                raise RuntimeError(f"{url} answered {response.status_code}")
            if i:
                timings.append(elapsed)
        results[url] = {"median_ms": round(statistics.median(timings), 1),
                        "max_ms": round(max(timings), 1)}
        print(f"{results[url]['median_ms']:8.1f} {results[url]['max_ms']:8.1f}  {url}",
              flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", default=None)
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run (seconds) that only proves the benchmark still works")
    args = parser.parse_args()
    if args.smoke:
        args.tenants, args.days, args.runs = 2, 2, 1
    from scripts.services import ensure_services

    services = ensure_services(REPO / "var", log=lambda *_: None)
    try:
        database_url = urlparse(services.database_url)._replace(
            path="/llm_platform_bench_consoles").geturl()
        recreate_database(database_url)
        setup_django(database_url, services.redis_url, ALLOWED_HOSTS="testserver")
        data = seed(args.tenants, args.days)
        print(f"seeded {data['num_rows']} hourly roll-ups in {data['seed_s']:.1f} s", flush=True)
        print("  median      max  page (ms, server time in-process)")
        pages = time_pages(data, args.runs)
    finally:
        from django.db import connections

        connections.close_all()
        services.stop()
    worst = max(p["max_ms"] for p in pages.values())
    worst_median = max(p["median_ms"] for p in pages.values())
    result = {"num_tenants": args.tenants, "num_days": args.days,
              "num_rollup_rows": data["num_rows"], "seed_s": round(data["seed_s"], 1),
              "runs": args.runs, "target_ms": TARGET_MS, "worst_median_ms": worst_median,
              "worst_max_ms": worst, "all_medians_under_target": worst_median < TARGET_MS,
              "pages": pages, "cpu_count": os.cpu_count()}
    print(json.dumps({k: v for k, v in result.items() if k != "pages"}, indent=2))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
