"""PostgreSQL has no read timeout; the watchdog gives the request path one: a query still
running past its bound has its connection cut and fails at once, and the next query gets a
fresh connection. On the real PostgreSQL (pg_sleep stands in for a hung server)."""
from __future__ import annotations

import time

import pytest
from django.db import OperationalError, connection

from llm_platform.db_watchdog import query_timeout

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_query_past_its_bound_fails_fast_and_the_next_one_works():
    started = time.monotonic()
    with query_timeout(0.5), pytest.raises(OperationalError):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(3)")  # the server ends it soon after: teardown
    assert time.monotonic() - started < 2.5  # cut at ~0.5 s, not after 3 s
    connection.close()  # the broken connection goes (the pool discards it)
    with query_timeout(5.0), connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def test_queries_outside_a_bound_are_not_cut():
    with connection.cursor() as cursor:  # a Celery roll-up, a migration: no bound
        cursor.execute("SELECT pg_sleep(0.6)")
    with query_timeout(5.0), connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(0.6)")  # within its bound
