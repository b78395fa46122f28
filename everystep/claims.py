"""Claiming runs: the one place where the database backends differ, side by side.

A claim takes up to ``limit`` ``scheduled`` runs, oldest first, and marks them
``running`` under the claimer's name. Concurrent claimers get disjoint sets:

- PostgreSQL: one autocommit ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE
  SKIP LOCKED) RETURNING``, a prepared statement. Rows another claimer has
  locked are skipped, not waited for.
- SQLite: the same ``UPDATE ... RETURNING`` without a lock clause: SQLite has
  one writer at a time, so the statement runs alone.
- MariaDB/MySQL: no ``UPDATE ... RETURNING``. A short transaction locks the
  rows with a plain ``FOR UPDATE`` (a concurrent claimer waits for it), then
  marks them.

``exclude`` names runs this worker still has in flight: a run requeued under a
live worker must not be run twice by it at once.

Workflows declared with ``max_concurrent`` are claimed first, by
:func:`everystep.limits.claim_limited` (a lock per workflow, then a count);
the statements here then skip their names. With no limit declared, the
statements are the ones without that filter, unchanged.

Invariant: a crash after a claim leaves the runs ``running`` under the
claimer's name; :func:`reclaim_own` hands them back to the next worker
started under that name.
"""

import functools
from collections.abc import Callable

from . import database, limits, registry, statements
from .models import Workflow

Status = Workflow.Status

RUN_COLUMNS = [field.column for field in Workflow._meta.concrete_fields]
# With each claimed run, whether it has recorded steps: a run claimed for the
# first time has none, and the runner then skips loading them (a round trip).
_RETURNING = (
    f"RETURNING {', '.join(RUN_COLUMNS)}, EXISTS (SELECT 1 FROM everystep_step "
    "WHERE everystep_step.workflow_id = everystep_workflow.id) AS has_steps"
)

# The excluded ids go as one array, so that the statement text, and with it
# the prepared plan, is the same whatever a worker has in flight.
_POSTGRESQL = (
    "UPDATE everystep_workflow SET status = 'running', claimed_by = %s WHERE id IN ("
    "SELECT id FROM everystep_workflow WHERE status = 'scheduled' AND id <> ALL(%s::uuid[]) {names}"
    "ORDER BY created_at LIMIT {limit} FOR UPDATE SKIP LOCKED) {returning}"
)
# Passing over the workflows that have a concurrency limit (claimed by
# everystep.limits under their lock): one more array, the same plan shape.
_SKIP_NAMES = "AND name <> ALL(%s::text[]) "
POSTGRESQL = _POSTGRESQL.format(names="", limit="%s", returning=_RETURNING)
POSTGRESQL_UNLIMITED = _POSTGRESQL.format(names=_SKIP_NAMES, limit="%s", returning=_RETURNING)
# The excluded ids are spliced in as placeholders: SQLite has no arrays.
SQLITE = (
    "UPDATE everystep_workflow SET status = 'running', claimed_by = %s WHERE id IN ("
    "SELECT id FROM everystep_workflow WHERE status = 'scheduled' {not_in}{not_limited}"
    f"ORDER BY created_at LIMIT %s) {_RETURNING}"
)


def claim_runs(claimer: str, limit: int, *, exclude=()) -> list[Workflow]:
    """Claim up to ``limit`` scheduled runs for ``claimer``, oldest first."""
    if limit <= 0:
        return []
    conn = database.connection()
    limited = registry.concurrency_limits()
    runs = limits.claim_limited(claimer, limit, exclude, limited) if limited else []
    if len(runs) < limit:
        claim = {"postgresql": _claim_postgresql, "sqlite": _claim_sqlite}.get(conn.vendor, _claim_mysql)
        runs += claim(conn, claimer, limit - len(runs), exclude, sorted(limited))
    return sorted(runs, key=lambda run: run.created_at)  # RETURNING keeps no order


def _claim_postgresql(conn, claimer: str, limit: int, exclude, skip_names) -> list[Workflow]:
    prepared = statements.prepared_statements()
    if prepared:
        # Through libpq, as a step's insert: a worker's pool thread claims once per run.
        values = [claimer, "{" + ",".join(str(run_id) for run_id in exclude) + "}"]
        if skip_names:
            values.append(_text_array(skip_names))
        if limit != 1:
            values.append(str(limit))
        rows = statements.fetch_libpq(conn, _CLAIMS_LIBPQ[bool(skip_names), limit == 1], values)
        if rows is not None:
            return [_run_from_row(conn, row) for row in rows]
    if skip_names:
        sql, params = POSTGRESQL_UNLIMITED, [claimer, list(exclude), skip_names, limit]
    else:
        sql, params = POSTGRESQL, [claimer, list(exclude), limit]
    rows = statements.execute(conn, sql, params, prepared, fetch=True)
    return [_run_from_row(conn, row) for row in rows]


def _claim_libpq(*, skip_names: bool, one: bool) -> statements.Libpq:
    """The claim prepared for libpq. A claim of one run (a pool thread's next
    run, the common case) has ``LIMIT 1`` in its text: with the limit as a
    parameter, PostgreSQL plans the statement again at every execution (a
    generic plan, not knowing the limit, never costs less than the custom
    ones), about 0.2 ms of the server's time per claim."""
    types = [statements.TEXT, statements.UUID_ARRAY]
    if skip_names:
        types.append(statements.TEXT_ARRAY)
    if not one:
        types.append(statements.INT8)
    sql = _POSTGRESQL.format(
        names=_SKIP_NAMES if skip_names else "", limit="1" if one else "%s", returning=_RETURNING
    )
    name = "everystep_claim" + ("_unlimited" if skip_names else "") + ("_one" if one else "")
    return statements.Libpq(name, sql, types)


_CLAIMS_LIBPQ = {
    (skip_names, one): _claim_libpq(skip_names=skip_names, one=one)
    for skip_names in (False, True)
    for one in (False, True)
}


def _text_array(items) -> str:
    """A PostgreSQL text[] literal: each element double-quoted, its quotes and
    backslashes escaped (a workflow's name may hold any character)."""
    quoted = ('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"' for item in items)
    return "{" + ",".join(quoted) + "}"


def _claim_sqlite(conn, claimer: str, limit: int, exclude, skip_names) -> list[Workflow]:
    excluded = [Workflow._meta.pk.get_db_prep_value(run_id, conn) for run_id in exclude]
    not_in = f"AND id NOT IN ({', '.join(['%s'] * len(excluded))}) " if excluded else ""
    not_limited = f"AND name NOT IN ({', '.join(['%s'] * len(skip_names))}) " if skip_names else ""
    sql = SQLITE.format(not_in=not_in, not_limited=not_limited)
    return list(Workflow.objects.using(conn.alias).raw(sql, [claimer, *excluded, *skip_names, limit]))


def _claim_mysql(conn, claimer: str, limit: int, exclude, skip_names) -> list[Workflow]:
    runs = Workflow.objects.using(conn.alias).claimable()
    if exclude:
        runs = runs.exclude(id__in=list(exclude))
    if skip_names:
        runs = runs.exclude(name__in=skip_names)
    with database.atomic():
        claimed = list(runs.select_for_update()[:limit])
        if claimed:
            Workflow.objects.using(conn.alias).filter(id__in=[run.id for run in claimed]).update(
                status=Status.RUNNING, claimed_by=claimer
            )
    for run in claimed:
        run.status, run.claimed_by = Status.RUNNING, claimer
    return claimed


def _run_from_row(conn, row) -> Workflow:
    *values, has_steps = row
    for i, decode in _run_decoders():
        values[i] = decode(values[i], None, conn)
    run = Workflow.from_db(conn.alias, RUN_COLUMNS, values)
    run.has_steps = has_steps
    return run


@functools.cache
def _run_decoders() -> list[tuple[int, Callable]]:
    """The columns that need their field's ``from_db_value``: psycopg's loaders
    already give uuids and aware datetimes, so on PostgreSQL that is the JSON
    fields, as Django's compiler would apply it. Worked out once per process."""
    fields = Workflow._meta.concrete_fields
    return [(i, field.from_db_value) for i, field in enumerate(fields) if hasattr(field, "from_db_value")]


def reclaim_own(claimer: str, limit: int) -> list[Workflow]:
    """Crash recovery at start-up: the runs left ``running`` under ``claimer``.

    Returns up to ``limit`` of them (oldest first) to run again; any beyond that
    are requeued, so that no run stays parked under a worker that will not get to it.
    """
    from .operations import release_run

    parked = list(Workflow.objects.parked_by(claimer).order_by("created_at"))
    for run in parked[limit:]:
        release_run(run.id, claimer)
    return parked[:limit]
