"""The management commands: thin argv mappings that refuse bad input clearly."""

import datetime as dt
import os
import sqlite3
import subprocess
import sys
import uuid
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from everystep.models import Step, Workflow
from tests.worker.support import ROOT, database_env

pytestmark = pytest.mark.django_db

S = Workflow.Status
CHAIN = "tests.worker.workflows.chain"


def make_run(status=S.SCHEDULED, claimed_by=None, days_ago=None) -> Workflow:
    completed_at = timezone.now() - dt.timedelta(days=days_ago) if days_ago is not None else None
    return Workflow.objects.create(
        name=CHAIN, args=[], status=status, claimed_by=claimed_by, completed_at=completed_at
    )


def run_command(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


# ---------------------------------------------------------------- everystep_worker


@pytest.mark.parametrize(
    "args, message",
    [
        (["--pool", "0"], r"pool size \(--pool\) must be 1 to 1,000, got 0"),
        # Past pool_size's 4-byte column no heartbeat is written, and shutdown never ends.
        (["--pool", "3000000000"], r"pool size \(--pool\) must be 1 to 1,000, got 3000000000"),
        (["--poll", "0"], "poll interval must be positive"),
        (["--poll", "nan"], "poll interval must be a finite number"),  # not an idle busy loop
        (["--poll", "1e10"], r"poll interval must be at most 86400 seconds \(a day\), got 1e\+10"),
        (["--drain", "-1"], "drain timeout must not be negative"),
        (["--drain", "nan"], "drain timeout must be a finite number"),  # not a drain that never ends
        (["--name", " "], "--name must not be empty"),
        (["--name", "x" * 256], "limit is 255"),
        (["--name", "w\x00"], "worker name .* NUL character"),
        (["--metrics-port", "70000"], "--metrics-port must be a TCP port"),
        (["--pool", "many"], "invalid int value"),
    ],
)
def test_worker_refuses_bad_options(args, message, monkeypatch):
    from everystep.worker import Worker

    # An option let through would start a worker that never returns: fail instead.
    monkeypatch.setattr(Worker, "run", lambda self: pytest.fail("the worker started"))
    with pytest.raises(CommandError, match=message):
        call_command("everystep_worker", *args)


def test_worker_refuses_heartbeat_settings_that_make_no_sense(settings):
    settings.EVERYSTEP_RECOVER_STALE_AFTER = 1
    with pytest.raises(CommandError, match=r"EVERYSTEP_RECOVER_STALE_AFTER \(1 s\) is less than 3 heartbeat"):
        call_command("everystep_worker")


def test_worker_command_maps_its_options_onto_the_worker(monkeypatch):
    from everystep.management.commands import everystep_worker

    made = {}

    class Recorder:
        abandoned = False

        def __init__(self, **options):
            made.update(options)

        def run(self):
            pass

    monkeypatch.setattr(everystep_worker, "Worker", Recorder)
    call_command("everystep_worker", "--pool", "3", "--poll", "0.5", "--name", "w-1", "--no-listen")
    assert (made["pool_size"], made["poll"], made["name"], made["listen"]) == (3, 0.5, "w-1", False)
    call_command("everystep_worker")
    assert made["listen"] is True


# ---------------------------------------------------------------- everystep_requeue


def test_requeue_runs_by_id():
    first, second = make_run(S.RUNNING, "w1"), make_run(S.RUNNING, "w2")
    out = run_command("everystep_requeue", str(first.id), str(second.id))
    assert out.splitlines() == [f"requeued {first.id}", f"requeued {second.id}"]
    assert set(Workflow.objects.values_list("status", "claimed_by")) == {(S.SCHEDULED, None)}


def test_requeue_reports_runs_it_could_not_requeue_and_requeues_the_others():
    running, done = make_run(S.RUNNING, "w1"), make_run(S.COMPLETED, "w1", days_ago=0)
    missing = uuid.uuid4()
    with pytest.raises(CommandError) as raised:
        run_command("everystep_requeue", str(done.id), str(running.id), str(missing))
    assert f"run {done.id} moved on: it is completed now, not running" in str(raised.value)
    assert f"run {missing} does not exist" in str(raised.value)
    assert Workflow.objects.get(id=running.id).status == S.SCHEDULED
    assert Workflow.objects.get(id=done.id).status == S.COMPLETED


def test_requeue_refuses_a_malformed_id_before_changing_anything():
    running = make_run(S.RUNNING, "w1")
    with pytest.raises(CommandError, match="'nope' is not a valid run id"):
        call_command("everystep_requeue", str(running.id), "nope")
    assert Workflow.objects.get(id=running.id).status == S.RUNNING


def test_requeue_by_claimer():
    mine = [make_run(S.RUNNING, "dead-worker") for _ in range(2)]
    other = make_run(S.RUNNING, "live-worker")
    out = run_command("everystep_requeue", "--claimer", "dead-worker")
    assert "2 run(s) of 'dead-worker' requeued" in out
    assert all(Workflow.objects.get(id=run.id).status == S.SCHEDULED for run in mine)
    assert Workflow.objects.get(id=other.id).status == S.RUNNING


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "either RUN_ID... or --claimer NAME"),
        ([str(uuid.uuid4()), "--claimer", "w1"], "either RUN_ID... or --claimer NAME"),
        (["--claimer", ""], "must not be empty"),
        (["--claimer", "w\x00"], "claimer name .* NUL character"),  # a DataError on PostgreSQL
    ],
)
def test_requeue_refuses_bad_input(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("everystep_requeue", *args)


# ---------------------------------------------------------------- everystep_prune


def test_prune_dry_run_then_delete():
    old = make_run(S.COMPLETED, days_ago=40)
    Step.objects.create(workflow=old, step_id="1", name="x.y", status="done", result=1)
    recent = make_run(S.COMPLETED, days_ago=1)
    blocked = make_run(S.BLOCKED, days_ago=40)

    assert "would delete 1 run(s) that ended more than 30 day(s) ago" in run_command(
        "everystep_prune", "--older-than", "30", "--dry-run"
    )
    assert Workflow.objects.count() == 3
    assert "deleted 1 run(s)" in run_command("everystep_prune", "--older-than", "30", "--batch", "1")
    assert set(Workflow.objects.values_list("id", flat=True)) == {recent.id, blocked.id}
    assert not Step.objects.exists()
    assert "deleted 1 run(s)" in run_command("everystep_prune", "--older-than", "30", "--status", "blocked")
    assert set(Workflow.objects.values_list("id", flat=True)) == {recent.id}


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "the following arguments are required: --older-than"),
        (["--older-than", "-1"], "--older-than must not be negative"),
        (["--older-than", "soon"], "invalid float value"),
        # What no timedelta or date holds: refused, not a ValueError/OverflowError traceback.
        (["--older-than", "nan"], "--older-than must be a number of days up to 36525"),
        (["--older-than", "inf"], "--older-than must be a number of days up to 36525"),
        (["--older-than", "1e6"], "--older-than must be a number of days up to 36525"),
        (["--older-than", "1e9"], "--older-than must be a number of days up to 36525"),
        (["--older-than", "1", "--batch", "0"], "--batch must be 1 to 100,000, got 0"),
        # Past 2**63 no database takes the LIMIT: a traceback, before this refusal.
        (["--older-than", "1", "--batch", str(2**63)], "--batch must be 1 to 100,000, got 92233720368"),
        (["--older-than", "1", "--status", "running"], "cannot prune runs in status running"),
        (["--older-than", "1", "--status", "completed", "--status", "scheduled"], "only terminal runs"),
    ],
)
def test_prune_refuses_bad_input(args, message):
    run = make_run(S.COMPLETED, days_ago=40)
    with pytest.raises(CommandError, match=message):
        call_command("everystep_prune", *args)
    assert Workflow.objects.filter(id=run.id).exists()


def test_prune_with_the_largest_documented_batch_on_a_stock_sqlite():
    # A batch's ids go to the database in IN lists of a bounded length, not as
    # one list of --batch parameters past SQLite's stock limit (32,766).
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's limit on bound parameters")
    connection.ensure_connection()
    connection.connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 32766)  # the stock build's
    prune_in_one_batch(33_000)


def test_prune_with_the_largest_documented_batch_on_postgresql_with_server_side_binding():
    # OPTIONS {"server_side_binding": True} (docs/workers.md, PgBouncer): the
    # PostgreSQL protocol takes at most 65,535 parameters in one statement.
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's limit on bound parameters")
    from django.db.backends.postgresql.base import ServerBindingCursor

    connection.ensure_connection()
    connection.connection.cursor_factory = ServerBindingCursor
    prune_in_one_batch(70_000)


def prune_in_one_batch(count: int) -> None:
    """``count`` runs ended 40 days ago, pruned with the largest batch the docs allow."""
    ended = timezone.now() - dt.timedelta(days=40)
    runs = [Workflow(name="x.y", args=[], status="completed", completed_at=ended) for _ in range(count)]
    Workflow.objects.bulk_create(runs, batch_size=500)
    call_command("everystep_prune", "--older-than", "30", "--batch", "100000")
    assert not Workflow.objects.exists()


# A real commit, not the test's open transaction: from Django 6.0 every command's
# system checks query the database (JSONField support), and on SQLite with
# IMMEDIATE transactions they would wait on the test's write lock.
@pytest.mark.django_db(transaction=True)
def test_bad_input_exits_non_zero_with_the_message():
    result = subprocess.run(
        [sys.executable, "-m", "django", "everystep_prune", "--older-than", "1", "--status", "running"],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": str(ROOT),
            **database_env(),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "CommandError: cannot prune runs in status running" in result.stderr


def test_worker_refuses_a_metrics_port_in_use():
    pytest.importorskip("prometheus_client")
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            call_command("everystep_worker", "--metrics-port", str(port), "--metrics-bind", "127.0.0.1")


@pytest.mark.parametrize("bind", ["metrics..internal", "a" * 64 + ".example"])
def test_worker_refuses_a_malformed_metrics_bind_host_clearly(bind, monkeypatch):
    # A host IDNA cannot encode: the same refusal as a taken port, not a UnicodeError traceback.
    pytest.importorskip("prometheus_client")
    from everystep import cron

    # Past the metrics server the worker would start for good: fail instead.
    monkeypatch.setattr(cron, "CronStarter", lambda *a, **k: pytest.fail("the worker started"))
    with pytest.raises(CommandError, match="cannot serve metrics on"):
        call_command("everystep_worker", "--metrics-port", "19391", "--metrics-bind", bind)
