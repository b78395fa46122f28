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

import logging
from collections.abc import Callable

from django.db import DatabaseError, InterfaceError, OperationalError, models
from django.db.models import ExpressionWrapper, F, TextField

from . import database, limits, registry, statements
from .errors import EverystepError
from .fields import EverystepJSONField
from .models import Workflow

logger = logging.getLogger("everystep")

Status = Workflow.Status

RUN_COLUMNS = [field.column for field in Workflow._meta.concrete_fields]
# The serde-encoded columns (args, result, error). A claim decodes them run by
# run (decode_stored), never inside Django's iteration: a run whose stored
# arguments no longer decode (an enum changed since) must fail alone, not end
# the claim of every run claimed with it, and the worker with it.
_ENCODED = [field for field in Workflow._meta.concrete_fields if isinstance(field, EverystepJSONField)]
STORED = "stored_"  # the prefix of such a column read undecoded by the ORM or raw()


def _returning(columns) -> str:
    # With each claimed run, whether it has recorded steps: a run claimed for the
    # first time has none, and the runner then skips loading them (a round trip).
    return (
        f"RETURNING {', '.join(columns)}, EXISTS (SELECT 1 FROM everystep_step "
        "WHERE everystep_step.workflow_id = everystep_workflow.id) AS has_steps"
    )


_RETURNING = _returning(RUN_COLUMNS)

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
    "ORDER BY created_at LIMIT %s) "
    + _returning(
        f"{column} AS {STORED}{column}" if column in {field.column for field in _ENCODED} else column
        for column in RUN_COLUMNS
    )
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
        try:
            runs += claim(conn, claimer, limit - len(runs), exclude, sorted(limited))
        except DatabaseError as exc:
            if not runs:
                raise
            # The limited runs are committed under our name: dropped here, they
            # would stay running with nobody executing them. The next claim retries.
            limits.kept_after_failure(claimer, runs, exc)
    return sorted(runs, key=lambda run: run.created_at)  # RETURNING keeps no order


def _claim_postgresql(conn, claimer: str, limit: int, exclude, skip_names) -> list[Workflow]:
    prepared = statements.prepared_statements()
    if prepared:
        # Through libpq, as a step's insert: a worker's pool thread claims once per run.
        values = [claimer, _uuid_array(exclude)]
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


# ------------------------------------------------------------ a run's end and the next claim

# A pool thread ends its run, then claims its slot's next one: on PostgreSQL
# both go as one statement, so one round trip and one commit per run fewer.
# The two updates never touch the same row: the ending run is ``running`` (and
# excluded), the claim takes a ``scheduled`` one. Its one row says whether the
# end matched, then holds the claimed run (NULLs when the queue was empty).
FINISH_AND_CLAIM = (
    f"WITH ended AS ({statements.FINISH_RUN} RETURNING 1), "
    f"claimed AS ({_POSTGRESQL.format(names='', limit='1', returning=_RETURNING)}) "
    "SELECT (SELECT count(*) FROM ended), claimed.* FROM (VALUES (1)) AS one LEFT JOIN claimed ON true"
)
_FINISH_AND_CLAIM_LIBPQ = statements.Libpq(
    "everystep_finish_and_claim",
    FINISH_AND_CLAIM,
    [statements.TEXT, statements.JSONB, statements.JSONB, statements.TIMESTAMPTZ, statements.UUID,
     statements.TEXT, statements.TEXT, statements.UUID_ARRAY],
)


class NextClaim:
    """A pool thread's claim of its next run, sent with the end of the run it
    has: :meth:`finish` stands in for ``operations.finish_run``. It claims
    only on PostgreSQL with no concurrency limit declared (their claim takes
    a lock first), and only while ``exclude()`` gives the runs to pass over
    (None: the worker is stopping). ``runs``: what it claimed, or None when it
    did not claim, and the thread claims as usual."""

    def __init__(self, exclude: Callable[[], list | None]):
        self.exclude = exclude
        self.runs: list[Workflow] | None = None

    def finish(self, run_id, claimer: str, status: str, *, result=None, error=None) -> bool:
        from .operations import finish_run

        conn = database.connection()
        exclude = None
        if conn.vendor == "postgresql" and not registry.concurrency_limits():
            exclude = self.exclude()
        if exclude is None:
            return finish_run(run_id, claimer, status, result=result, error=error)
        try:
            row = _finish_and_claim(conn, run_id, claimer, status, result, error, exclude)
        except (OperationalError, InterfaceError):
            raise  # the connection: the caller reconnects and ends the run again
        except DatabaseError as exc:
            # The claim must never cost a run its end: end it alone.
            logger.warning("run %s: its end with the next claim failed (%s); ending it alone", run_id, exc)
            return finish_run(run_id, claimer, status, result=result, error=error)
        ended, *claimed = row
        self.runs = [] if claimed[0] is None else [_run_from_row(conn, claimed)]
        return ended == 1


def _finish_and_claim(conn, run_id, claimer: str, status: str, result, error, exclude) -> tuple:
    prepared = statements.prepared_statements()
    if prepared:
        values = statements.end_values(conn, run_id, claimer, status, result, error, text=True)
        values += [claimer, _uuid_array(exclude)]
        rows = statements.fetch_libpq(conn, _FINISH_AND_CLAIM_LIBPQ, values)
        if rows is not None:
            return rows[0]
    params = statements.end_values(conn, run_id, claimer, status, result, error, text=False)
    params += [claimer, list(exclude)]
    return statements.execute(conn, FINISH_AND_CLAIM, params, prepared, fetch=True)[0]


def _uuid_array(ids) -> str:
    """A PostgreSQL uuid[] literal (a uuid's text needs no quoting)."""
    return "{" + ",".join(map(str, ids)) + "}"


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
    runs = Workflow.objects.using(conn.alias).raw(sql, [claimer, *excluded, *skip_names, limit])
    return [decode_stored(run, conn) for run in runs]


def _claim_mysql(conn, claimer: str, limit: int, exclude, skip_names) -> list[Workflow]:
    runs = Workflow.objects.using(conn.alias).claimable()
    if exclude:
        runs = runs.exclude(id__in=list(exclude))
    if skip_names:
        runs = runs.exclude(name__in=skip_names)
    with database.atomic():
        claimed = list(undecoded(runs).select_for_update()[:limit])
        if claimed:
            Workflow.objects.using(conn.alias).filter(id__in=[run.id for run in claimed]).update(
                status=Status.RUNNING, claimed_by=claimer
            )
    for run in claimed:
        run.status, run.claimed_by = Status.RUNNING, claimer
        decode_stored(run, conn)
    return claimed


def _run_from_row(conn, row) -> Workflow:
    """A run from a row of :data:`RUN_COLUMNS` and ``has_steps``, as given by
    psycopg: its loaders already give uuids and aware datetimes, so only the
    encoded columns need decoding, as Django's compiler would decode them."""
    *values, has_steps = row
    run = Workflow.from_db(conn.alias, RUN_COLUMNS, values)
    run.has_steps = has_steps
    return decode_stored(run, conn, prefix="")


def decode_stored(run: Workflow, conn, prefix: str = STORED) -> Workflow:
    """Decode the run's encoded columns, read undecoded as ``prefix + name``.
    Stored arguments that no longer decode (an enum value or a class they name
    changed or went away since) stay plain JSON, with the error as
    ``run.unreadable_args``: the runner fails that run alone."""
    attributes = vars(run)
    for field in _ENCODED:
        stored = attributes.pop(prefix + field.attname)
        try:
            value = field.from_db_value(stored, None, conn)
        except EverystepError as exc:
            value = models.JSONField.from_db_value(field, stored, None, conn)
            if field.name == "args":
                run.unreadable_args = exc
        setattr(run, field.attname, value)
    return run


def undecoded(runs: models.QuerySet) -> models.QuerySet:
    """``runs`` with their encoded columns read as the database gives them, as
    ``stored_<name>``, for :func:`decode_stored`."""
    names = [field.attname for field in _ENCODED]
    as_text = {STORED + name: ExpressionWrapper(F(name), output_field=TextField()) for name in names}
    return runs.defer(*names).annotate(**as_text)


def reclaim_own(claimer: str, limit: int) -> list[Workflow]:
    """Crash recovery at start-up: the runs left ``running`` under ``claimer``.

    Returns up to ``limit`` of them (oldest first) to run again; any beyond that
    are requeued, so that no run stays parked under a worker that will not get to it.
    """
    from .operations import release_run

    conn = database.connection()
    parked = list(undecoded(Workflow.objects.parked_by(claimer)).order_by("created_at"))
    for run in parked[limit:]:
        release_run(run.id, claimer)
    return [decode_stored(run, conn) for run in parked[:limit]]
