"""The engine's hot-path SQL: what every run and every step sends.

Recording a step, loading a run's outcomes and ending a run (and the claim,
in ``everystep.claims``) are written as SQL rather than through the ORM:
building an ORM query costs about 0.3 ms of CPU, about as much as the round
trip it makes, and a worker sends one per step and three per run. On
PostgreSQL, on an autocommit connection (a worker's), the claim, the step
insert and the run's end go out through libpq as prepared statements of
everystep's own, planned once per connection. The load of a run's outcomes
(once per replayed run), and any statement sent inside a transaction, go
through a psycopg cursor unprepared: psycopg must never hold a prepared
statement of its own on everystep's connection (see :func:`execute`).

Values are stored exactly as ``EverystepJSONField`` stores them
(``serde.encode``, then the backend's JSON adaptation) and read back through
the fields' own converters, so a row reads the same whichever path wrote it.
Every write to a claimed run is fenced: it matches only while the run is
``running`` under the given claimer, and reports whether it did.
"""

import contextlib
import functools
import json
import json.encoder
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError
from django.utils import timezone

from . import database, serde

if TYPE_CHECKING:
    import psycopg

# The fence: the run's claimer, while it is running. Written as one
# expression, which no index serves, rather than as ``status = 'running' AND
# claimed_by = %s``: then the only index a fenced statement can use is the
# primary key. Given the two conditions, PostgreSQL sometimes plans the lookup
# through the claimer's or the status index instead (on a table not analyzed
# yet, or whose statistics predate the worker's name), reading every run the
# worker ever claimed, or every running run, for each step it records.
RUNNING_UNDER = "CASE WHEN status = 'running' THEN claimed_by END = %s"
INSERT_STEP = (
    "INSERT INTO everystep_step (workflow_id, step_id, name, args, kwargs, status, result, error) "
    "SELECT %s, %s, %s, %s, %s, %s, %s, %s FROM everystep_workflow "
    f"WHERE id = %s AND {RUNNING_UNDER}"
)
LOAD_OUTCOMES = "SELECT step_id, status, name, result, error FROM everystep_step WHERE workflow_id = %s"
FINISH_RUN = (
    "UPDATE everystep_workflow SET status = %s, result = %s, error = %s, completed_at = %s "
    f"WHERE id = %s AND {RUNNING_UNDER}"
)


def insert_step(
    conn, run_id, claimer: str, step_id: str, name: str, status: str, *, args, kwargs, result,
    error, prepared: bool, run_text: str | None = None,
) -> bool:
    """Record a step whose values are already ``serde``-encoded; False if fenced out.
    ``conn``: this thread's connection to everystep's database (the runner
    looks it up once per thread and run: :meth:`RunState.connection`).
    ``run_text``: ``str(run_id)``, when the caller keeps it (the runner does,
    once per run)."""
    if prepared and conn.vendor == "postgresql":
        run_text = str(run_id) if run_text is None else run_text
        values = [run_text, step_id, name, _json_text(args), _json_text(kwargs), status,
                  _json_text(result), _json_text(error), run_text, claimer]
        written = _write_libpq(conn, _INSERT_STEP_LIBPQ, values)
        if written is not None:
            return written == 1
    run = uuid_param(conn, run_id)
    params = [
        run, step_id, name, json_param(conn, args), json_param(conn, kwargs), status,
        json_param(conn, result), json_param(conn, error), run, claimer,
    ]
    return execute(conn, INSERT_STEP, params, prepared) == 1


def load_outcomes(run_id) -> Iterator[tuple[str, str, str, Any, Any]]:
    """``(step_id, status, name, result, error)`` of every recorded step, values
    decoded as they are consumed (a long run's replay holds one decoded copy)."""
    from .models import Step

    conn = database.connection()
    decode = Step._meta.get_field("result").from_db_value
    rows = execute(conn, LOAD_OUTCOMES, [uuid_param(conn, run_id)], prepared_statements(), fetch=True)
    return (
        (step_id, status, name, decode(result, None, conn), decode(error, None, conn))
        for step_id, status, name, result, error in rows
    )


def finish_run(run_id, claimer: str, status: str, *, result=None, error=None) -> bool:
    """``running`` under ``claimer`` -> ``status``; False if the run moved on."""
    conn = database.connection()
    prepared = prepared_statements()
    if prepared and conn.vendor == "postgresql":
        values = end_values(conn, run_id, claimer, status, result, error, text=True)
        written = _write_libpq(conn, _FINISH_RUN_LIBPQ, values)
        if written is not None:
            return written == 1
    params = end_values(conn, run_id, claimer, status, result, error, text=False)
    return execute(conn, FINISH_RUN, params, prepared) == 1


def end_values(conn, run_id, claimer: str, status: str, result, error, *, text: bool) -> list:
    """The parameters of :data:`FINISH_RUN`: as libpq's text (``text``), or
    adapted for a cursor. ``result`` and ``error`` are not encoded yet."""
    stored_result = None if result is None else serde.encode(result)
    stored_error = None if error is None else serde.encode(error)
    if text:
        return [status, _json_text(stored_result), _json_text(stored_error), timezone.now().isoformat(),
                str(run_id), claimer]
    return [
        status,
        json_param(conn, stored_result),
        json_param(conn, stored_error),
        conn.ops.adapt_datetimefield_value(timezone.now()),
        uuid_param(conn, run_id),
        claimer,
    ]


def json_param(conn, encoded):
    return None if encoded is None else conn.ops.adapt_json_value(encoded, None)


def uuid_param(conn, value):
    return value if conn.features.has_native_uuid_field else value.hex


def prepared_statements_setting():
    """``EVERYSTEP_PREPARED_STATEMENTS`` as set (True unless set): False for a
    pooler that cannot keep prepared statements (PgBouncer in transaction mode
    before 1.21). Check E012 refuses anything but a boolean."""
    from django.conf import settings

    return getattr(settings, "EVERYSTEP_PREPARED_STATEMENTS", True)


def prepared_statements() -> bool:
    """Whether the hot path prepares its statements: only when the setting is
    True. A value E012 refuses ("False" read from the environment, in a process
    that runs no checks) turns them off, which works behind every pooler."""
    return prepared_statements_setting() is True


def execute(conn, sql: str, params: list, prepared: bool, *, fetch: bool = False):
    """Run ``sql`` on ``conn`` through a cursor; the rows (``fetch``) or the
    number of rows written. With ``prepared`` on PostgreSQL, a psycopg cursor
    that binds the values on the server (:func:`_binding_cursor`), else
    Django's, which binds them on the client.

    Never as a prepared statement of psycopg's (``prepare=False``): while
    psycopg holds one on a connection, every ROLLBACK or ROLLBACK TO SAVEPOINT
    on it (a step's own ``transaction.atomic()`` that fails, the engine's own
    savepoints) makes psycopg send ``DEALLOCATE ALL``. PostgreSQL then drops
    everystep's libpq statements too, which are prepared again on the next
    call; but PgBouncer that keeps prepared statements (1.24.1 in the suite)
    forgets them, and cuts the client off at their next execution ("prepared
    statement did not exist"): the run goes back
    to the queue and its step runs again. The statements that take this path
    are the load of a run's outcomes (once per replayed run, so planning it
    each time costs little) and, inside a transaction only, those that
    otherwise go through libpq."""
    if prepared and conn.vendor == "postgresql":
        with conn.wrap_database_errors:
            cursor = _binding_cursor(conn)
            cursor.execute(sql, params, prepare=False)
            return cursor.fetchall() if fetch else cursor.rowcount
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if fetch else cursor.rowcount


POOLER_HINT = (
    "(a prepared statement of this connection is missing or doubled: a pooler in transaction mode, "
    "such as PgBouncer before 1.21 or without max_prepared_statements, stands between everystep and "
    "PostgreSQL; set EVERYSTEP_PREPARED_STATEMENTS = False)"
)


@contextlib.contextmanager
def _pooler_hint():
    """Add :data:`POOLER_HINT` to a lost or doubled prepared statement's error;
    the same error class, so the callers' handling stays."""
    try:
        yield
    except DatabaseError as exc:
        if _lost_prepared_statement(exc):
            raise type(exc)(f"{exc} {POOLER_HINT}") from exc
        raise


def _lost_prepared_statement(exc: DatabaseError) -> bool:
    """PostgreSQL's "prepared statement ... does not exist" (26000) or "... already
    exists" (42P05): what a statement prepared on one server connection meets on another."""
    return getattr(exc.__cause__, "sqlstate", None) in ("26000", "42P05")

# ------------------------------------------------------------ the step insert and a run's end, through libpq
#
# A step's insert is the one statement a worker sends per step, a run's end
# the last one per run. Through a psycopg cursor a statement costs about 75 us
# of CPU (adapting each parameter, the query's conversion, the
# prepared-statement cache, the result's bookkeeping); sent straight through
# libpq, prepared once per connection with its parameter types declared and
# its values already as text, about 35 us. Only on an autocommit connection:
# in a transaction psycopg must send its BEGIN first, so the cursor path,
# unprepared (see execute), handles that case (and the setting turning
# prepared statements off).


class Libpq:
    """A statement prepared under ``name`` with its parameters' type OIDs."""

    def __init__(self, name: str, sql: str, types: list[int]):
        parts = sql.split("%s")
        if len(parts) != len(types) + 1:
            raise ValueError(f"{name}: {len(parts) - 1} placeholders for {len(types)} types")
        # %s -> $1, $2, ...: the same text as the cursor path, numbered.
        numbered = parts[0] + "".join(f"${i}{part}" for i, part in enumerate(parts[1:], 1))
        self.name, self.sql, self.types = name.encode(), numbered.encode(), types


# Parameter type OIDs (pg_type): what each text value is read as.
UUID, TEXT, JSONB, TIMESTAMPTZ, INT8, UUID_ARRAY, TEXT_ARRAY = 2950, 25, 3802, 1184, 20, 2951, 1009
_INSERT_STEP_LIBPQ = Libpq(
    "everystep_insert_step", INSERT_STEP,
    [UUID, TEXT, TEXT, JSONB, JSONB, TEXT, JSONB, JSONB, UUID, TEXT],
)
_FINISH_RUN_LIBPQ = Libpq(
    "everystep_finish_run", FINISH_RUN, [TEXT, JSONB, JSONB, TIMESTAMPTZ, UUID, TEXT]
)


def _write_libpq(conn, statement: Libpq, values: list[str | None]) -> int | None:
    """The rows ``statement`` wrote, sent through libpq; None when ``conn`` is
    in a transaction (the caller then takes the cursor path)."""
    result = _send_libpq(conn, statement, values)
    return None if result is None else int(result.command_tuples or 0)


def fetch_libpq(conn, statement: Libpq, values: list[str | None]) -> list[tuple] | None:
    """The rows ``statement`` returned, sent through libpq and loaded by the
    connection's own loaders (as a psycopg cursor loads them); None when
    ``conn`` is in a transaction (the caller then takes the cursor path)."""
    result = _send_libpq(conn, statement, values)
    if result is None:
        return None
    from psycopg.adapt import Transformer

    loader = Transformer(conn.connection)
    loader.set_pgresult(result)
    return loader.load_rows(0, result.ntuples, tuple)


def _send_libpq(conn, statement: Libpq, values: list[str | None]):
    pg = _autocommit_psycopg(conn)
    if pg is None:
        return None
    try:
        return _execute_libpq(pg, statement, values)
    except Exception:
        # psycopg's errors become Django's, as on the cursor path (the wrapper
        # also marks the connection for a check), with the pooler hint; built
        # on the way out only, as a statement's wrappers cost about as much
        # as the rest of its Python.
        with _pooler_hint(), conn.wrap_database_errors:
            raise


def _json_text(encoded) -> str | None:
    """What the backend's JSON adaptation sends for an encoded value (``json.dumps``)."""
    if encoded is None:
        return None
    if type(encoded) in _JSON_SCALARS:
        return _SCALAR_TEXT[type(encoded)](encoded)
    if _ENCODE_C is None:
        return _JSON_ENCODER.encode(encoded)
    return "".join(_ENCODE_C(encoded, 0))


# json.dumps with its defaults, without re-reading its keyword arguments per
# call; the scalars a step most often takes and returns skip the encoder.
_JSON_ENCODER = json.JSONEncoder()
_SCALAR_TEXT = {int: int.__repr__, bool: lambda value: "true" if value else "false",
                str: _JSON_ENCODER.encode}
_JSON_SCALARS = frozenset(_SCALAR_TEXT)


def _c_encoder():
    """The encoder's C part, made once: JSONEncoder.encode makes it again at
    every call, which costs more than encoding a step's few arguments. Made as
    encode makes it, but with no markers (the cycle check): it is shared by
    threads, and a value has been through serde, which refuses a cycle, before
    it gets here. Its arguments are CPython's own (3.11 to 3.13), not a public
    API: where they differ, or there is no C part, None, and the text comes
    from _JSON_ENCODER.encode. Its options are read from _JSON_ENCODER, so
    that both paths make the same text."""
    if json.encoder.c_make_encoder is None:
        return None
    options = _JSON_ENCODER
    try:
        return json.encoder.c_make_encoder(
            None, options.default,
            json.encoder.encode_basestring_ascii if options.ensure_ascii else json.encoder.encode_basestring,
            options.indent, options.key_separator, options.item_separator,
            options.sort_keys, options.skipkeys, options.allow_nan,
        )
    except TypeError:
        return None


_ENCODE_C = _c_encoder()


def _autocommit_psycopg(conn) -> "psycopg.Connection | None":
    """The psycopg connection under Django's, when it is in autocommit; else None."""
    pg = conn.connection
    if pg is None:
        conn.ensure_connection()
        pg = conn.connection
    return pg if pg.autocommit else None


def _execute_libpq(pg: "psycopg.Connection", statement: Libpq, values: list[str | None]):
    """Execute ``statement`` (prepared on this connection first if need be); its
    result. Errors are psycopg's, as the cursor path raises them."""
    errors, pq = _psycopg()
    params = [None if value is None else value.encode() for value in values]
    with pg.lock:
        pgconn = pg.pgconn
        # The names prepared belong to this psycopg connection's session, not to
        # Django's connection: Django's pool lends that one another psycopg
        # connection after each close. Preparing a name twice in one session is
        # an error on PostgreSQL, and PgBouncer 1.21+ cuts the client off for it.
        prepared = pg.__dict__.setdefault("_everystep_prepared", set())
        for attempt in (1, 2):
            if statement.name not in prepared:
                _prepare(pgconn, statement, pg.info.encoding)
                prepared.add(statement.name)
            result = pgconn.exec_prepared(statement.name, params)
            if result.status in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
                return result
            error = _error(pgconn, result, pg.info.encoding)
            if isinstance(error, errors.InvalidSqlStatementName) and attempt == 1:
                prepared.discard(statement.name)  # deallocated behind our back (DISCARD ALL)
                continue
            raise error
    raise AssertionError("unreachable")


@functools.cache
def _psycopg():
    """psycopg's ``errors`` and ``pq``, imported on first use (not on every
    backend, not on every statement)."""
    from psycopg import errors, pq

    return errors, pq


def _prepare(pgconn, statement: Libpq, encoding: str) -> None:
    errors, pq = _psycopg()

    result = pgconn.prepare(statement.name, statement.sql, statement.types)
    if result.status != pq.ExecStatus.COMMAND_OK:
        error = _error(pgconn, result, encoding)
        # Prepared under this name by an earlier user of this pooled connection.
        if not isinstance(error, errors.DuplicatePreparedStatement):
            raise error


def _error(pgconn, result, encoding: str) -> Exception:
    """The exception psycopg would raise for a failed ``result``: a lost
    connection is an ``OperationalError``, whatever the server last said."""
    import psycopg
    from psycopg import errors, pq

    if pgconn.status == pq.ConnStatus.BAD:
        message = (result.error_message or pgconn.error_message).decode(encoding, "replace").strip()
        return psycopg.OperationalError(f"the connection is lost: {message}")
    return errors.error_from_result(result, encoding=encoding)


def _binding_cursor(conn) -> "psycopg.Cursor":
    """A server-side-binding psycopg cursor kept on the Django connection
    (Django's cursors bind on the client). Executed with ``prepare=False``
    only (see :func:`execute`); the connection's ``prepare_threshold`` is left
    as Django set it."""
    import psycopg

    conn.ensure_connection()
    pg = conn.connection
    cursor = getattr(conn, "_everystep_cursor", None)
    if cursor is None or cursor.connection is not pg or cursor.closed:
        cursor = conn._everystep_cursor = psycopg.Cursor(pg)
    return cursor
