import os
import subprocess
import sys
import threading

import pytest
from django.db import transaction

from everystep import database, runner, step, workflow
from everystep.api import schedule
from everystep.errors import EverystepError
from everystep.models import Workflow
from tests.core import workflows as w
from tests.helpers import CLAIMER, run_workflow
from tests.worker.support import wait_for


@pytest.mark.django_db
def test_schedule_inserts_a_scheduled_run_with_its_arguments():
    run = schedule(w.sequential, 3)
    row = Workflow.objects.get(id=run.id)
    assert (row.name, row.args, row.status) == ("tests.core.workflows.sequential", [3], "scheduled")
    assert row.id.version == 7
    assert row.idempotency_key is None


@pytest.mark.django_db
def test_schedule_refuses_a_plain_function_and_writes_nothing():
    with pytest.raises(TypeError, match="needs a @workflow"):
        schedule(print, 1)
    with pytest.raises(TypeError, match="needs a @workflow"):
        schedule(w.record, "a")  # a step is not a workflow
    assert not Workflow.objects.exists()


@pytest.mark.django_db
def test_schedule_refuses_unserializable_or_ill_fitting_arguments():
    with pytest.raises(EverystepError, match="not serializable"):
        schedule(w.sequential, object())
    with pytest.raises(TypeError, match="arguments do not fit"):
        schedule(w.sequential, 1, 2)
    assert not Workflow.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_schedule_is_rolled_back_with_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic(using=database.alias()):
        schedule(w.sequential, 1)
        raise RuntimeError("the caller's view failed")
    assert not Workflow.objects.exists()


@pytest.mark.django_db
def test_idempotency_key_returns_the_existing_run():
    first = schedule(w.sequential, 1, idempotency_key="order-42")
    second = schedule(w.sequential, 2, idempotency_key="order-42")
    assert second.id == first.id and second.args == [1]
    other = schedule(w.three_steps, idempotency_key="order-42")  # keys are per workflow
    assert other.id != first.id
    assert Workflow.objects.count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize(
    "first_key, second_key",
    [("Order-A", "order-a"), ("k", "k "), ("strasse", "straße"), ("e", "é")],
    ids=["case", "trailing-space", "sharp-s", "accent"],
)
def test_idempotency_keys_are_compared_exactly(first_key, second_key):
    """Only the same key is the same request: on MariaDB/MySQL the column's
    default collation folded case, accents and trailing spaces (migration 0016)."""
    first = schedule(w.sequential, 1, idempotency_key=first_key)
    second = schedule(w.sequential, 2, idempotency_key=second_key)
    assert second.id != first.id, f"key {second_key!r} returned the run of key {first_key!r}"
    assert second.args == [2]
    assert schedule(w.sequential, 3, idempotency_key=second_key).id == second.id


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["a\x00b", "a\ud800b"], ids=["nul", "surrogate"])
def test_schedule_refuses_an_unstorable_key_and_writes_nothing(key):
    """NUL or a lone surrogate: a malformed key on every backend, not a raw
    DataError (PostgreSQL) or UnicodeEncodeError, nor a key only some store."""
    with pytest.raises(EverystepError, match="the idempotency key .* is refused"):
        schedule(w.sequential, 1, idempotency_key=key)
    assert not Workflow.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("key", [None, "order-deep"])
def test_arguments_the_database_refuses_are_a_clear_error_and_write_nothing(key):
    """MariaDB's JSON check refuses nesting past 32 levels, which the other
    backends store: the refusal was a raw IntegrityError, and with a key an
    IndexError from looking for a winning run that does not exist."""
    connection = database.connection()
    if connection.vendor != "mysql" or not connection.mysql_is_mariadb:
        pytest.skip("only MariaDB's JSON check refuses arguments every other backend stores")
    with pytest.raises(EverystepError, match="the database refused the run of .*, nothing was written"):
        schedule(w.sequential, w.nested(40), idempotency_key=key)
    assert not Workflow.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_idempotency_key_under_concurrency_yields_one_run_and_healthy_transactions():
    callers = 6
    # SQLite's BEGIN IMMEDIATE already serializes the callers: no barrier inside there
    barrier = threading.Barrier(callers if database.connection().vendor != "sqlite" else 1, timeout=30)
    ids, errors = [], []

    def caller():
        try:
            with transaction.atomic(using=database.alias()):
                barrier.wait()
                run = schedule(w.sequential, 1, idempotency_key="race")
                # the caller's transaction is still usable after losing the race
                Workflow.objects.filter(id=run.id).exists()
            ids.append(run.id)
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            database.connection().close()

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(ids) == callers and len(set(ids)) == 1
    assert Workflow.objects.filter(idempotency_key="race").count() == 1


def lock_waiter(vendor: str):
    """This session's id, and a query telling whether a session waits on a row lock."""
    with database.connection().cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute("SELECT pg_backend_pid()")
            query = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s"
            return cursor.fetchone()[0], query
        cursor.execute("SELECT CONNECTION_ID()")
        query = (
            "SELECT trx_state = 'LOCK WAIT' FROM information_schema.innodb_trx "
            "WHERE trx_mysql_thread_id = %s"
        )
        return cursor.fetchone()[0], query


@pytest.mark.django_db(transaction=True)
def test_losing_the_idempotency_race_returns_the_winner_and_keeps_the_transaction_usable():
    """The loser's lookup runs before the winner commits (so it finds nothing) and
    its insert waits on the winner's row; the winner commits only once that wait
    is seen, so the loser's insert really conflicts."""
    if database.connection().vendor == "sqlite":
        pytest.skip("SQLite's BEGIN IMMEDIATE serializes the callers: the loser's lookup finds the winner")
    inserted, loser_waits = threading.Event(), threading.Event()
    session: list = []
    ids, errors = {}, []

    def winner():
        try:
            with transaction.atomic(using=database.alias()):
                ids["winner"] = schedule(w.sequential, 1, idempotency_key="race").id
                inserted.set()
                assert loser_waits.wait(30), "the loser's insert never waited on the winner's row"
        except Exception as exc:  # reported below
            errors.append(exc)
            inserted.set()
        finally:
            database.connection().close()

    def loser():
        try:
            assert inserted.wait(30)
            with transaction.atomic(using=database.alias()):
                session.append(lock_waiter(database.connection().vendor))
                run = schedule(w.sequential, 2, idempotency_key="race")
                # the caller's transaction is still usable after losing the race
                assert Workflow.objects.filter(id=run.id).exists()
            ids["loser"] = run.id
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            database.connection().close()

    threads = [threading.Thread(target=winner), threading.Thread(target=loser)]
    for thread in threads:
        thread.start()

    def loser_is_waiting():
        if not session:
            return False
        pid, query = session[0]
        with database.connection().cursor() as cursor:
            cursor.execute(query, [pid])
            row = cursor.fetchone()
        return bool(row and row[0])

    try:
        wait_for(loser_is_waiting, timeout=30, interval=0.01, what="the loser's insert to wait on the winner")
    finally:
        loser_waits.set()
        for thread in threads:
            thread.join(60)
    assert errors == []
    assert ids["loser"] == ids["winner"]
    row = Workflow.objects.get(idempotency_key="race")
    assert row.args == [1]


@pytest.mark.django_db(transaction=True)
def test_a_repeatable_read_caller_that_cannot_see_its_keys_run_is_told_to_retry():
    """PostgreSQL at REPEATABLE READ: the key's run committed after the caller's
    snapshot, so the lookup misses it, the insert conflicts, and the winner is
    invisible to every read of the transaction: a clear error, not a raw
    DoesNotExist; retried, the transaction gets the run."""
    conn = database.connection()
    if conn.vendor != "postgresql":
        pytest.skip("PostgreSQL's REPEATABLE READ snapshot (MySQL's locking read sees the winner)")

    def repeatable_read():
        with conn.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        Workflow.objects.exists()  # the caller's view read something: its snapshot is taken

    def other_caller():
        try:
            schedule(w.sequential, 1, idempotency_key="k")
        finally:
            database.connection().close()

    retry = "after this transaction's snapshot.*retry the transaction"
    with pytest.raises(EverystepError, match=retry), transaction.atomic(using=database.alias()):
        repeatable_read()
        thread = threading.Thread(target=other_caller)
        thread.start()
        thread.join(30)
        schedule(w.sequential, 2, idempotency_key="k")
    with transaction.atomic(using=database.alias()):
        repeatable_read()
        run = schedule(w.sequential, 2, idempotency_key="k")
    assert run.args == [1]


def test_importing_everystep_imports_no_models_and_needs_no_settings():
    """A project's settings module may import everystep: nothing at import time
    may load models or read settings (here none are configured)."""
    code = (
        "import sys, everystep\n"
        "from everystep import database, step, workflow, parallel, schedule, Terminal\n"
        "from everystep import context, serde, errors\n"
        "from django.conf import settings\n"
        "assert 'everystep.models' not in sys.modules, 'models imported'\n"
        "assert not settings.configured, 'settings were read'\n"
        "print('ok')\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.stdout.strip() == "ok", out.stderr


@workflow
def schedules_in_its_body(key=None):
    return str(schedule(w.sequential, 1, idempotency_key=key).id)


@step
def schedules_in_a_step():
    return str(schedule(w.sequential, 1, idempotency_key="follow-up").id)


@workflow
def schedules_from_a_step():
    return schedules_in_a_step()


def follow_ups():
    return Workflow.objects.filter(name="tests.core.workflows.sequential")


@pytest.mark.django_db
def test_schedule_in_a_workflow_body_without_a_key_is_refused_as_every_replay_would_repeat_it():
    row = run_workflow(schedules_in_its_body)
    assert row.status == "failed"
    message = row.error["message"]
    assert "schedule(tests.core.workflows.sequential) was called in the workflow's body" in message
    assert "start_child()" in message
    assert not follow_ups().exists()


@pytest.mark.django_db
@pytest.mark.parametrize("body, args", [(schedules_in_its_body, ("follow-up",)), (schedules_from_a_step, ())])
def test_schedule_with_a_key_in_a_body_or_inside_a_step_starts_one_run_across_replays(body, args):
    row = run_workflow(body, *args)
    assert row.status == "completed", row.error
    Workflow.objects.filter(id=row.id).update(status="running", claimed_by=CLAIMER)
    runner.execute(Workflow.objects.get(id=row.id), CLAIMER)  # a replay of the whole body
    row.refresh_from_db()
    assert row.result == str(follow_ups().get().id)
