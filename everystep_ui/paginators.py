"""A changelist paginator that does not ``COUNT(*)`` a huge table on every page view."""

from django.core.paginator import Paginator
from django.db import connections
from django.utils.functional import cached_property


def estimated_row_count(queryset) -> int | None:
    """PostgreSQL's planner estimate of the table's rows, or None where there is none.

    ``pg_class.reltuples`` is kept by VACUUM/ANALYZE: cheap to read, roughly right,
    and -1 for a table never analysed.
    """
    connection = connections[queryset.db]
    if connection.vendor != "postgresql":
        return None
    table = connection.ops.quote_name(queryset.model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)", [table])
        row = cursor.fetchone()
    if row is None or row[0] is None or row[0] < 0:
        return None
    return int(row[0])


def estimated_match_count(queryset) -> int | None:
    """PostgreSQL's planner estimate of the rows a filtered queryset matches
    (``EXPLAIN``: planned, not run), or None where there is none."""
    connection = connections[queryset.db]
    if connection.vendor != "postgresql":
        return None
    sql, params = queryset.order_by().values("pk").query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):  # psycopg 2 hands the JSON over as text
        import json

        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


class EstimatedCountPaginator(Paginator):
    """Exact counts for small tables and lists, the planner's estimate for a
    list above ``estimate_threshold`` rows: counting exactly reads every
    matching index entry, a cost that grows with the history (a filter
    matching 800,000 runs of a million took 70 ms to count, bench/flat_costs.py).

    Unfiltered, the estimate is the table's (``pg_class.reltuples``);
    filtered, the plan's row estimate, and the exact count when the plan
    expects ``estimate_threshold`` rows or fewer."""

    estimate_threshold = 100_000
    estimated = False  # whether ``count`` is an estimate
    recounted = False  # whether it was made exact, at the estimate's last page

    @cached_property
    def count(self):
        queryset = self.object_list
        if hasattr(queryset, "query"):
            filtered = bool(queryset.query.where)
            estimate = estimated_match_count(queryset) if filtered else estimated_row_count(queryset)
            if estimate is not None and estimate > self.estimate_threshold:
                self.estimated = True
                return estimate
        return super().count

    def validate_number(self, number):
        # From the estimate's last page on, the count is made exact: below the
        # real one (an ANALYZE behind a growing table, a plan's guess), it
        # would leave the oldest runs on no page. One count, for the tail only.
        # Above the real one, it offered pages past the last: they show the last.
        if self.estimated and _page_number(number) >= self.num_pages:
            self.__dict__["count"] = Paginator.count.func(self)
            self.__dict__.pop("num_pages", None)
            self.estimated, self.recounted = False, True
        if self.recounted and _page_number(number) > self.num_pages:
            number = self.num_pages
        return super().validate_number(number)


def _page_number(number) -> int:
    try:
        return int(number)
    except (TypeError, ValueError):
        return 0
