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


class EstimatedCountPaginator(Paginator):
    """Exact counts for filtered lists and small tables, the planner's estimate
    for an unfiltered list of a table above ``estimate_threshold`` rows."""

    estimate_threshold = 100_000

    @cached_property
    def count(self):
        queryset = self.object_list
        if hasattr(queryset, "query") and not queryset.query.where:
            estimate = estimated_row_count(queryset)
            if estimate is not None and estimate > self.estimate_threshold:
                return estimate
        return super().count
