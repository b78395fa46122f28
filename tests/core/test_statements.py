"""The engine's hot-path SQL (everystep.statements): rows it writes read the same
through the ORM, and on PostgreSQL it is prepared unless the setting says not to
(through libpq, never as psycopg's own prepared statements)."""

import datetime as dt
import json
import uuid
from contextlib import contextmanager

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.db import DatabaseError, IntegrityError, OperationalError, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import given

from everystep import checks, database, operations, registry, runner, serde, statements
from everystep.errors import EverystepError
from everystep.models import ChildRun, Step, Workflow
from tests.core import workflows as w
from tests.core.child_workflows import every_fenced_write
from tests.core.test_serde import values
from tests.helpers import CLAIMER, run_workflow

VALUE = {"when": dt.date(2026, 12, 2), "pair": (1, "a"), "id": uuid.UUID(int=7), "$es": "user data"}


def prepared_statements() -> list[str]:
    with database.connection().cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.django_db
def test_a_run_ended_in_sql_reads_back_through_the_orm():
    run = Workflow.objects.create(name="x.y", args=[], status="running", claimed_by=CLAIMER)
    before = timezone.now()
    assert statements.finish_run(run.id, CLAIMER, "completed", result=VALUE)
    run.refresh_from_db()
    assert run.status == "completed" and run.result == VALUE
    # Stored as the ORM stores datetimes, so ORM filters on the column still match it.
    ended = Workflow.objects.filter(completed_at__gte=before, completed_at__lte=timezone.now())
    assert list(ended.values_list("pk", flat=True)) == [run.pk]


@pytest.mark.django_db
def test_finishing_is_fenced_on_status_and_claimer():
    run = Workflow.objects.create(name="x.y", args=[], status="running", claimed_by="someone-else")
    assert not statements.finish_run(run.id, CLAIMER, "completed", result=1)
    Workflow.objects.filter(pk=run.pk).update(claimed_by=CLAIMER, status="stopped")
    assert not statements.finish_run(run.id, CLAIMER, "completed", result=1)
    run.refresh_from_db()
    assert run.status == "stopped" and run.result is None


@pytest.mark.django_db
def test_outcomes_written_by_the_orm_load_decoded():
    run = Workflow.objects.create(name="x.y", args=[], status="running", claimed_by=CLAIMER)
    Step.objects.create(workflow=run, step_id="1", name="a.b", status="done", result=VALUE)
    error = {"type": "builtins.ValueError", "message": "no", "args": ["no"]}
    Step.objects.create(workflow=run, step_id="2", name="a.c", status="failed", error=error)
    assert sorted(statements.load_outcomes(run.id)) == [
        ("1", "done", "a.b", VALUE, None),
        ("2", "failed", "a.c", None, error),
    ]


def fresh_session():
    """A new database session, so that no earlier test's prepared statements count."""
    if database.connection().vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    database.connection().close()


@pytest.mark.django_db(transaction=True)
def test_the_hot_path_is_prepared_on_postgresql():
    fresh_session()
    assert run_workflow(w.sequential, 3).status == "completed"
    prepared = "\n".join(prepared_statements())
    assert "INSERT INTO everystep_step" in prepared
    assert "UPDATE everystep_workflow SET status = $1, result = $2" in prepared
    # The load of a run's outcomes (once per replayed run) goes through a
    # cursor, unprepared: psycopg holds no prepared statement of its own.
    assert "SELECT step_id, status, name, result, error FROM everystep_step" not in prepared
    assert all(name.startswith("everystep_") for name in prepared_statement_names())


@pytest.mark.django_db
def test_in_a_transaction_psycopg_prepares_nothing_of_its_own():
    """In a transaction everything goes through the cursor path (the claim, the
    load, the inserts, the end): unprepared, so no ``_pg3_`` statement of psycopg's."""
    autocommit_postgresql()
    assert database.connection().in_atomic_block
    run = run_workflow(w.sequential, 3)
    assert run.status == "completed"
    assert len(list(statements.load_outcomes(run.id))) == 3
    assert [name for name in prepared_statement_names() if not name.startswith("everystep_")] == []


@pytest.mark.django_db(transaction=True)
def test_a_rollback_on_everystep_connection_leaves_its_libpq_statements_prepared():
    """psycopg sends DEALLOCATE ALL after a ROLLBACK (or ROLLBACK TO SAVEPOINT)
    while it holds a prepared statement of its own: PostgreSQL then drops
    everystep's libpq statements too, and PgBouncer 1.21+ cuts the client off
    at their next execution (tests/worker/test_pgbouncer.py). The load of a
    run's outcomes must leave psycopg holding none."""
    autocommit_postgresql()
    run = Workflow.objects.create(name="x.y", args=[], status="running", claimed_by=CLAIMER)
    assert insert(run.id, "1")
    assert [outcome[0] for outcome in statements.load_outcomes(run.id)] == ["1"]
    with pytest.raises(ValueError), transaction.atomic(using=database.alias()):
        Workflow.objects.filter(id=run.id).update(name="x.z")
        raise ValueError("rolled back")
    assert "everystep_insert_step" in prepared_statement_names()


# "False" read from the environment: E012 refuses it where checks run; a
# process that runs none (a web server scheduling runs) must not prepare.
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("off", [False, "False"])
def test_prepared_statements_can_be_turned_off_for_a_pooler(off, settings):
    settings.EVERYSTEP_PREPARED_STATEMENTS = off
    fresh_session()
    run = run_workflow(w.sequential, 3)
    assert run.status == "completed" and run.steps.count() == 3
    assert prepared_statements() == []


@pytest.mark.parametrize("value", ["False", "0", None, 0])
def test_a_prepared_statements_setting_that_is_not_a_boolean_is_a_check_error(value):
    # "False" read from the environment is truthy: the statements would stay on.
    with override_settings(EVERYSTEP_PREPARED_STATEMENTS=value):
        errors = [error for error in run_checks() if (error.id or "").startswith("everystep")]
    assert [error.id for error in errors] == ["everystep.E012"]
    assert errors[0].msg == f"EVERYSTEP_PREPARED_STATEMENTS is {value!r}, not True or False."


# On an autocommit PostgreSQL connection (a worker's), the step insert goes
# straight through libpq; in a transaction (the tests above) through a psycopg
# cursor. Both must read the same.


@given(values)
def test_the_json_sent_through_libpq_is_what_json_dumps_makes(value):
    # The text the libpq path sends must be what the cursor path's JSON
    # adaptation (json.dumps) sends: the same rows, however they were written.
    # None is SQL's NULL on both paths.
    encoded = serde.encode(value)
    assert statements._json_text(encoded) == (None if encoded is None else json.dumps(encoded))


def test_a_python_whose_c_json_encoder_takes_other_arguments_gets_the_same_text(monkeypatch):
    # The shared C encoder is made with CPython's private arguments; a Python
    # that changed them must fall back to the pure encoder, not fail to import.
    def other_arguments(*args):
        raise TypeError(f"c_make_encoder() takes 10 arguments ({len(args)} given)")

    monkeypatch.setattr(json.encoder, "c_make_encoder", other_arguments)
    encoder = statements._c_encoder()
    monkeypatch.undo()  # json.dumps below makes its own with the real one
    monkeypatch.setattr(statements, "_ENCODE_C", encoder)
    value = {"name": "é", "items": [1, 2.5, None, True], "nested": {"k": "v"}}
    assert statements._json_text(value) == json.dumps(value)


def autocommit_postgresql():
    if database.connection().vendor != "postgresql":
        pytest.skip("the libpq path is PostgreSQL's")


def insert(run_id, step_id: str, *, claimer: str = CLAIMER, result=None) -> bool:
    return statements.insert_step(
        database.connection(), run_id, claimer, step_id, "a.b", "done", args=serde.encode([VALUE]),
        kwargs={}, result=serde.encode(result), error=None, prepared=True,
    )


@pytest.mark.django_db(transaction=True)
def test_in_autocommit_rows_read_back_through_the_orm():
    autocommit_postgresql()
    run = Workflow.objects.create(name="x.y", args=[], status="running", claimed_by=CLAIMER)
    assert insert(run.id, "1", result=VALUE)
    assert not insert(run.id, "2", claimer="someone-else")  # fenced
    step = Step.objects.get(workflow=run)
    assert (step.step_id, step.args, step.kwargs, step.result) == ("1", [VALUE], {}, VALUE)
    error = {"type": "builtins.ValueError", "message": "no", "args": ["no"]}
    Step.objects.create(workflow=run, step_id="3", name="a.c", status="failed", error=error)
    assert sorted(statements.load_outcomes(run.id)) == [
        ("1", "done", "a.b", VALUE, None),
        ("3", "failed", "a.c", None, error),
    ]
    before = timezone.now()
    assert statements.finish_run(run.id, CLAIMER, "completed", result=VALUE)
    assert not statements.finish_run(run.id, CLAIMER, "completed", result=1)  # fenced: ended
    run.refresh_from_db()
    assert run.status == "completed" and run.result == VALUE
    assert before <= run.completed_at <= timezone.now()
    assert "everystep_insert_step" in prepared_statement_names()


def prepared_statement_names() -> list[str]:
    with database.connection().cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.django_db(transaction=True)
def test_through_libpq_a_duplicate_step_is_an_integrity_error_and_the_connection_goes_on():
    autocommit_postgresql()
    run = Workflow.objects.create(name="x.y", args=[], status="running", claimed_by=CLAIMER)
    assert insert(run.id, "1")
    with pytest.raises(IntegrityError, match="everystep_step_workflow_step_id_uniq"):
        insert(run.id, "1")
    assert insert(run.id, "2")
    assert Step.objects.filter(workflow=run).count() == 2


@pytest.mark.django_db(transaction=True)
def test_through_libpq_statements_deallocated_behind_its_back_are_prepared_again():
    autocommit_postgresql()
    assert run_workflow(w.sequential, 2).status == "completed"
    with database.connection().cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # what a pooler's DISCARD ALL does
    assert run_workflow(w.sequential, 2).status == "completed"
    assert "everystep_insert_step" in prepared_statement_names()


@pytest.mark.django_db(transaction=True)
def test_through_libpq_a_statement_missing_again_once_prepared_again_has_the_pooler_hint(monkeypatch):
    """What a pooler that keeps no prepared statements (PgBouncer before 1.21)
    does: each time prepared on one server connection, executed on another."""
    autocommit_postgresql()
    monkeypatch.setattr(statements, "_prepare", lambda *args: None)
    never = statements.Libpq("everystep_test_never_prepared", "SELECT %s + 1", [statements.INT8])
    with pytest.raises(DatabaseError, match="set EVERYSTEP_PREPARED_STATEMENTS = False"):
        statements.fetch_libpq(database.connection(), never, ["1"])


@pytest.mark.django_db(transaction=True)
def test_through_libpq_a_lost_connection_is_an_operational_error():
    autocommit_postgresql()
    run = Workflow.objects.create(name="x.y", args=[], status="running", claimed_by=CLAIMER)
    assert insert(run.id, "1")
    conn = database.connection()
    pid = conn.connection.info.backend_pid
    with psycopg_session() as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(OperationalError, match="connection"):
        insert(run.id, "2")
    conn.close()
    assert insert(run.id, "2")  # reconnected


@contextmanager
def psycopg_session():
    """A second session on the test database, outside Django's connection."""
    import psycopg

    params = database.connection().get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as other:
        yield other


# ------------------------------------------------ the fenced statements' plans
#
# A fenced write names its run by primary key; it must be planned through
# that key whatever the table's statistics say. Given ``status = 'running' AND
# claimed_by = ...`` as two conditions, PostgreSQL planned it through the
# claimer's or the status index when the statistics predated the worker's runs
# (a fresh table, a new worker's name), reading every run the worker had
# claimed, or every running run, for each step recorded.

# The statements as the engine prepares them, with their parameters' types.
FENCED = {"a step's insert": statements._INSERT_STEP_LIBPQ, "a run's end": statements._FINISH_RUN_LIBPQ}


@pytest.fixture
def stale_statistics(db):
    """A run ``running`` under CLAIMER, among 2,000 it ran before, none of
    them known to the statistics of the runs' table."""
    if database.connection().vendor != "postgresql":
        pytest.skip("PostgreSQL's planner")
    with database.connection().cursor() as cursor:
        # A copy of the runs' table with the same indexes, for this transaction
        # only: it stands in for the real one in this session, and its
        # statistics go with it (ANALYZE on the real table would leave its
        # row count behind for the tests after this one).
        cursor.execute(
            "CREATE TEMPORARY TABLE everystep_workflow (LIKE public.everystep_workflow INCLUDING ALL)"
        )
    Workflow.objects.bulk_create(
        Workflow(name="x.y", args=[], status="completed", claimed_by=f"old-{i % 10}") for i in range(300)
    )
    with database.connection().cursor() as cursor:
        cursor.execute("ANALYZE everystep_workflow")
    Workflow.objects.bulk_create(
        Workflow(name="x.y", args=[], status="completed", claimed_by=CLAIMER) for _ in range(2000)
    )
    run = Workflow.objects.create(name="x.y", args=[], status="running", claimed_by=CLAIMER)
    with database.connection().cursor() as cursor:
        # Also in the real table, for the foreign keys of the rows a write adds (a wait, a child's link).
        cursor.execute(
            "INSERT INTO public.everystep_workflow SELECT * FROM everystep_workflow WHERE id = %s", [run.id]
        )
    return run


def run_lookups(sql: str, params=()) -> list[str | None]:
    """The index each scan of the runs' table in ``sql``'s plan goes through."""
    with database.connection().cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0][0]["Plan"]
    return [scan.get("Index Name") for scan in _run_scans(plan)]


def _run_scans(plan: dict) -> list[dict]:
    scan = plan["Node Type"].endswith("Scan") and plan.get("Relation Name") == "everystep_workflow"
    below = [found for child in plan.get("Plans", []) for found in _run_scans(child)]
    return [plan, *below] if scan else below


@pytest.mark.parametrize("plan_cache_mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("statement", sorted(FENCED))
def test_a_fenced_statement_finds_its_run_by_primary_key_whatever_the_statistics(
    stale_statistics, statement, plan_cache_mode
):
    prepared = FENCED[statement]
    run = stale_statistics
    values = {
        statements.UUID: str(run.id), statements.TEXT: CLAIMER, statements.JSONB: "1",
        statements.TIMESTAMPTZ: timezone.now(),
    }
    with database.connection().cursor() as cursor:
        cursor.execute("SELECT %s::oid[]::regtype[]::text[]", [prepared.types])
        (types,) = cursor.fetchone()
        cursor.execute(f"SET LOCAL plan_cache_mode = {plan_cache_mode}")
        cursor.execute(f"PREPARE fenced({', '.join(types)}) AS {prepared.sql.decode()}")
    params = [values[oid] for oid in prepared.types]
    lookups = run_lookups(f"EXECUTE fenced({', '.join(['%s'] * len(params))})", params)
    with database.connection().cursor() as cursor:
        cursor.execute("DEALLOCATE fenced")
    assert lookups == ["everystep_workflow_pkey"]


def test_a_runs_fenced_orm_writes_find_it_by_primary_key_whatever_the_statistics(stale_statistics):
    run = stale_statistics
    Workflow.objects.filter(id=run.id).update(name=registry.qualified_name(every_fenced_write), args=[3])
    with CaptureQueriesContext(database.connection()) as queries:
        runner.execute(Workflow.objects.get(id=run.id), CLAIMER)
        assert Workflow.objects.get(id=run.id).status == "waiting"
        operations.release_run(run.id, CLAIMER)  # a drain's release (of a run that has left by now)
        with pytest.raises(EverystepError, match="is waiting: only a running run can be requeued"):
            operations.requeue_run(run.id, expected_status=None, expected_claimer=CLAIMER)
    # A child run went into the copy only: its link would fail its foreign key at the test's end.
    ChildRun.objects.filter(parent_id=run.id).delete()
    fenced = [query["sql"] for query in queries if f"'{CLAIMER}'" in query["sql"].partition(" WHERE ")[2]]
    # The unsafe step's completion, the child's start, the wait's completion, the suspension, the
    # release, an operator's requeue from that claimer.
    assert len(fenced) >= 6, fenced
    assert {sql: run_lookups(sql) for sql in fenced} == {sql: ["everystep_workflow_pkey"] for sql in fenced}


# ------------------------------------------------ Django's own statements prepared (everystep.W003)

PROBE = "everystep_probe"


@pytest.fixture
def probed(monkeypatch):
    """``probed(**options)``: the W003 check's warnings for everystep's database
    on PostgreSQL with these ``OPTIONS`` (a database never connected to)."""

    def check(prepared: bool = True, **options):
        db = {"ENGINE": "django.db.backends.postgresql", "NAME": "probe", "OPTIONS": options}
        monkeypatch.setitem(settings.DATABASES, PROBE, db)
        with override_settings(EVERYSTEP_DATABASE=PROBE, EVERYSTEP_PREPARED_STATEMENTS=prepared):
            return [warning.id for warning in checks.check_prepare_threshold(None)]

    return check


def test_prepare_threshold_with_server_side_binding_is_a_warning(probed):
    assert probed(server_side_binding=True, prepare_threshold=5) == ["everystep.W003"]
    assert probed(server_side_binding=True, prepare_threshold=0) == ["everystep.W003"]


def test_django_statements_never_prepared_are_no_warning(probed):
    assert probed() == []
    assert probed(server_side_binding=True) == []  # Django's default threshold: None
    assert probed(server_side_binding=True, prepare_threshold=None) == []
    assert probed(prepare_threshold=5) == []  # Django's client-side-binding cursors never prepare
    # everystep prepares nothing itself: a DEALLOCATE ALL drops nothing of its own.
    assert probed(prepared=False, server_side_binding=True, prepare_threshold=5) == []


def test_the_test_settings_have_no_prepare_threshold_warning():
    assert checks.check_prepare_threshold(None) == []
