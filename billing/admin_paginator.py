"""Admin lists of the big billing tables without a count(*) over the whole table."""
from __future__ import annotations

from django.core.paginator import Paginator
from django.db import connections
from django.utils.functional import cached_property


class EstimatedCountPaginator(Paginator):
    """An unfiltered list of a table with at least `exact_below` rows counts with PostgreSQL's
    planner estimate (pg_class.reltuples, kept by autovacuum/ANALYZE) instead of scanning it;
    filtered lists, and small tables, count exactly."""

    exact_below = 100_000

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not queryset.query.where:
            with connections[queryset.db].cursor() as cursor:
                cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                               [queryset.model._meta.db_table])
                row = cursor.fetchone()
            if row is not None and row[0] >= self.exact_below:
                return int(row[0])
        return super().count
