"""Concurrency limits, ``@workflow(max_concurrent=N)``: no claim lets more than N
runs of the workflow be ``running`` at once, whoever claims, whenever: two
claimers at the same instant (threads), an embedded worker's pool (threads),
worker processes on PostgreSQL and MariaDB; every way out of ``running`` frees
a slot; other workflows' runs are claimed meanwhile; a bad limit is refused."""

import datetime as dt
import importlib
import os
import re
import signal
import threading
from collections import Counter

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from everystep import claims, database, limits, operations
from everystep.api import schedule, workflow
from everystep.checks import check_workflow_modules
from everystep.errors import EverystepError
from everystep.models import ConcurrencyLimit, Heartbeat, Workflow
from tests.worker import workflows as w
from tests.worker.support import ROOT, wait_for, wait_until_up

pytestmark = pytest.mark.django_db(transaction=True)

S = Workflow.Status

# Steps log "start"/"end" with CLOCK_MONOTONIC (one clock for every process of
# the machine), so that the test can tell how many bodies ran at once. A body
# of ``limited`` holds its slot for ``seconds`` (so that runs claimed together
# overlap), then until ``limit`` bodies are in at once (it then logs "full",
# which lets every body in go) or nothing of the workflow is left to claim: the
# limit is reached whatever the machine's load, and a claim that breaks it
# shows as more bodies at once.
FLOWS = """\
    import time

    from everystep import step, workflow
    from everystep.context import current
    from everystep.models import Workflow


    def note(log, *words):
        with open(log, "a") as file:
            file.write(" ".join(str(word) for word in words) + "\\n")


    def released(log, run_id, limit, name):
        with open(log) as file:
            lines = [line.split() for line in file]
        mine = next(i for i, line in enumerate(lines) if line[:2] == ["start", str(run_id)])
        if any(line[0] == "full" for line in lines[mine:]):
            return True
        starts = sum(line[0] == "start" for line in lines)
        if starts - sum(line[0] == "end" for line in lines) >= limit:
            note(log, "full", run_id, time.monotonic_ns())
            return True
        return not Workflow.objects.filter(name=name, status="scheduled").exists()


    @step
    def hold(log, limit, seconds):
        ctx = current()
        note(log, "start", ctx.workflow_id, time.monotonic_ns())
        time.sleep(seconds)  # the workload: bodies claimed together overlap
        while not released(log, ctx.workflow_id, limit, ctx.workflow_name):
            time.sleep(0.01)  # the other bodies, in any process, write to the log
        note(log, "end", ctx.workflow_id, time.monotonic_ns())


    @workflow(max_concurrent={limit})
    def limited(log, limit, seconds):
        hold(log, limit, seconds)


    @step
    def touch(log):
        note(log, "free", current().workflow_id, time.monotonic_ns())


    @workflow
    def unlimited(log):
        touch(log)
"""


def flows_app(scratch_modules, limit=2):
    """A scratch app whose workflows module declares ``limited`` (at most
    ``limit`` running) and ``unlimited``; its name and the imported module."""
    app = scratch_modules.app(FLOWS.format(limit=limit))
    return app, importlib.import_module(f"{app}.workflows")


def declare(scratch_modules, name="capped", limit=2):
    """A workflow with ``max_concurrent=limit``, registered for this test only; its name."""

    def body():
        return None

    body.__name__ = body.__qualname__ = name
    body.__module__ = f"{scratch_modules.prefix}.flows"
    return workflow(max_concurrent=limit)(body).__everystep__.name


def add_runs(name, count) -> list:
    runs = [Workflow(name=name, args=[]) for _ in range(count)]
    Workflow.objects.bulk_create(runs)
    return [run.id for run in runs]


def running(name) -> int:
    return Workflow.objects.filter(name=name, status=S.RUNNING).count()


def overlap(log) -> int:
    """The most bodies of ``limited`` that ran at once, from their start/end lines."""
    events = []
    for line in w.read_log(log):
        if line[0] in ("start", "end"):
            events.append((int(line[2]), 0 if line[0] == "end" else 1))
    now = most = 0
    for _, starts in sorted(events):  # at equal times an end comes before a start
        now += 1 if starts else -1
        most = max(most, now)
    return most


# ---------------------------------------------------------------- the decorator


@pytest.mark.parametrize("value", [0, -1, 1.5, "2", True])
def test_a_limit_that_is_not_a_positive_integer_is_refused_at_import(scratch_modules, value):
    with pytest.raises(EverystepError) as refused:
        declare(scratch_modules, limit=value)
    assert str(refused.value) == (
        f"workflow {scratch_modules.prefix}.flows.capped: max_concurrent={value!r}: the limit must be "
        "a positive integer (the most runs of this workflow running at once), or None for no limit"
    )


@pytest.mark.parametrize("value", [2**31, 10**20])
def test_a_limit_the_database_cannot_store_is_refused_at_import(scratch_modules, value):
    """Every claim writes the limit to its lock row: a limit no backend's column
    holds (PostgreSQL's integer is the narrowest) would fail every claim of
    every worker, other workflows' included."""
    with pytest.raises(EverystepError) as refused:
        declare(scratch_modules, limit=value)
    assert str(refused.value) == (
        f"workflow {scratch_modules.prefix}.flows.capped: max_concurrent={value!r}: the limit must be "
        f"at most {2**31 - 1} (what the database stores); use None for no limit"
    )


def test_the_largest_limit_is_stored_and_claims(scratch_modules):
    name = declare(scratch_modules, limit=2**31 - 1)
    ids = add_runs(name, 2)
    other = add_runs("tests.worker.workflows.chain", 1)
    assert sorted(run.id for run in claims.claim_runs("w1", 10)) == sorted([*ids, *other])
    assert ConcurrencyLimit.objects.get(name=name).max_concurrent == 2**31 - 1


def test_a_bad_limit_in_a_workflows_module_is_the_import_check_error(settings, scratch_modules):
    app = scratch_modules.app(FLOWS.format(limit=0))
    with override_settings(INSTALLED_APPS=[*settings.INSTALLED_APPS, app]):
        errors = check_workflow_modules(None)
    assert [error.id for error in errors] == ["everystep.E002"]
    assert f"EverystepError: workflow {app}.workflows.limited: max_concurrent=0: the limit" in errors[0].msg


# ---------------------------------------------------------------- the claim


def test_a_claim_takes_no_more_than_the_limit_and_a_finished_run_frees_its_slot(scratch_modules):
    name = declare(scratch_modules, limit=2)
    ids = add_runs(name, 5)

    first = claims.claim_runs("w1", 10)
    assert [run.id for run in first] == ids[:2]  # the oldest two
    assert claims.claim_runs("w2", 10) == []  # full, whoever asks
    assert ConcurrencyLimit.objects.get(name=name).max_concurrent == 2

    assert operations.finish_run(ids[0], "w1", S.COMPLETED)
    assert [run.id for run in claims.claim_runs("w2", 10)] == [ids[2]]
    assert running(name) == 2


def test_other_workflows_runs_are_claimed_behind_a_full_limited_one(scratch_modules):
    name = declare(scratch_modules, limit=1)
    capped = add_runs(name, 3)  # older than the others: they would be claimed first
    others = add_runs("tests.worker.workflows.chain", 3)

    claimed = [run.id for run in claims.claim_runs("w1", 10)]
    assert sorted(claimed) == sorted([capped[0], *others])  # one of the limited, all the others
    assert claims.claim_runs("w1", 10) == []  # nothing spins: the rest waits for the slot
    assert Counter(Workflow.objects.filter(name=name).values_list("status", flat=True)) == {
        S.RUNNING: 1,
        S.SCHEDULED: 2,
    }


def test_a_worker_that_has_a_run_in_flight_does_not_claim_it_again(scratch_modules):
    name = declare(scratch_modules, limit=3)
    ids = add_runs(name, 2)
    assert [run.id for run in claims.claim_runs("w1", 1)] == [ids[0]]
    operations.requeue_run(ids[0])  # by an operator, while w1 still executes it
    assert [run.id for run in claims.claim_runs("w1", 5, exclude=[ids[0]])] == [ids[1]]


EXITS = {
    "completed": lambda run_id: operations.finish_run(run_id, "w1", S.COMPLETED),
    "failed": lambda run_id: operations.finish_run(run_id, "w1", S.FAILED, error={"type": "ValueError"}),
    "stopped by an operator": lambda run_id: operations.stop_run(run_id),
    "requeued by an operator": lambda run_id: operations.requeue_run(run_id),
    "released at a drain": lambda run_id: operations.release_run(run_id, "w1"),
    "requeued with its worker's runs": lambda run_id: operations.requeue_claimer("w1"),
}


@pytest.mark.parametrize("way_out", list(EXITS))
def test_every_way_out_of_running_frees_the_slot(scratch_modules, way_out):
    name = declare(scratch_modules, limit=1)
    ids = add_runs(name, 2)
    assert [run.id for run in claims.claim_runs("w1", 5)] == [ids[0]]
    assert claims.claim_runs("w2", 5) == []

    EXITS[way_out](ids[0])
    # A requeued run goes back to the queue, oldest: it takes the slot again.
    expected = ids[0] if Workflow.objects.get(id=ids[0]).status == S.SCHEDULED else ids[1]
    assert [run.id for run in claims.claim_runs("w2", 5)] == [expected]
    assert running(name) == 1


def test_a_stale_workers_runs_keep_their_slots_until_recovery_requeues_them(scratch_modules):
    name = declare(scratch_modules, limit=2)
    ids = add_runs(name, 3)
    claims.claim_runs("crashed", 5)
    Heartbeat.objects.create(
        name="crashed", hostname="h", pid=1, version="0", pool_size=4,
        started_at="2026-01-01T00:00:00Z", last_seen="2026-01-01T00:00:00Z",
    )
    assert claims.claim_runs("alive", 5) == []  # its runs may still be executing: they count

    assert sorted(operations.requeue_stale_worker("crashed", 60)) == sorted(ids[:2])
    assert [run.id for run in claims.claim_runs("alive", 5)] == ids[:2]


def test_a_restart_resumes_its_parked_runs_without_exceeding_the_limit(scratch_modules):
    name = declare(scratch_modules, limit=2)
    ids = add_runs(name, 4)
    claims.claim_runs("steady", 5)  # then the worker is killed: both stay running under its name

    resumed = claims.reclaim_own("steady", 4)
    fresh = claims.claim_runs("steady", 4 - len(resumed), exclude=[run.id for run in resumed])
    assert [run.id for run in resumed] == ids[:2]
    assert fresh == []
    assert running(name) == 2


def test_the_first_claim_makes_the_lock_row_and_an_emptied_table_is_refilled(scratch_modules):
    name = declare(scratch_modules, limit=2)
    add_runs(name, 3)
    assert not ConcurrencyLimit.objects.exists()
    assert len(claims.claim_runs("w1", 1)) == 1
    ConcurrencyLimit.objects.all().delete()
    assert len(claims.claim_runs("w1", 5)) == 1
    assert list(ConcurrencyLimit.objects.values_list("name", "max_concurrent")) == [(name, 2)]


def _session_id(conn) -> int | None:
    with conn.cursor() as cursor:
        if conn.vendor == "postgresql":
            cursor.execute("SELECT pg_backend_pid()")
        elif conn.vendor == "mysql":
            cursor.execute("SELECT CONNECTION_ID()")
        else:
            return None
        return cursor.fetchone()[0]


def _waits_on_a_lock(session) -> bool:
    """Whether the database session ``session`` is waiting for a lock now."""
    with database.connection().cursor() as cursor:
        if database.connection().vendor == "postgresql":
            cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [session])
            row = cursor.fetchone()
            return row is not None and row[0] == "Lock"
        cursor.execute(
            "SELECT COUNT(*) FROM information_schema.innodb_trx "
            "WHERE trx_mysql_thread_id = %s AND trx_state = 'LOCK WAIT'",
            [session],
        )
        return cursor.fetchone()[0] > 0


def test_two_claimers_at_the_same_moment_never_exceed_the_limit(scratch_modules, monkeypatch):
    """Each claimer, once it has counted the running runs, is held until the
    other has either counted too (no lock: both saw none running) or is
    waiting for the workflow's lock (PostgreSQL, MariaDB) or has begun its
    claim (SQLite: the first holds the database's write lock). Then both go on."""
    name = declare(scratch_modules, limit=2)
    add_runs(name, 6)
    arrived = {who: threading.Event() for who in ("a", "b")}
    counted = {who: threading.Event() for who in ("a", "b")}
    go = {who: threading.Event() for who in ("a", "b")}
    sessions, claimed, errors = {}, {}, []
    count = limits.running_count
    claim_locked = limits._claim_locked

    def arriving(claimer, *args):
        sessions[claimer] = _session_id(database.connection())
        arrived[claimer].set()
        return claim_locked(claimer, *args)

    def counting(workflow_name):
        value = count(workflow_name)
        who = threading.current_thread().name
        counted[who].set()
        assert go[who].wait(30), "the test never let this claimer go on"
        return value

    monkeypatch.setattr(limits, "_claim_locked", arriving)
    monkeypatch.setattr(limits, "running_count", counting)
    start = threading.Barrier(2)

    def claimer(who):
        try:
            start.wait()
            claimed[who] = claims.claim_runs(who, 5)
        except Exception as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(who,), name=who) for who in ("a", "b")]
    for thread in threads:
        thread.start()
    first = wait_for(lambda: next((who for who in "ab" if counted[who].is_set()), None), what="a count")
    other = "b" if first == "a" else "a"

    def held_back() -> bool:
        if counted[other].is_set():
            return True  # the broken case: both counted before either claimed
        if not arrived[other].is_set():
            return False
        return database.connection().vendor == "sqlite" or _waits_on_a_lock(sessions[other])

    wait_for(held_back, timeout=30, what="the second claimer to count or wait for the lock")
    go[first].set()
    go[other].set()
    for thread in threads:
        thread.join(60)

    assert errors == []
    assert sorted(len(batch) for batch in claimed.values()) == [0, 2]
    assert running(name) == 2


# ---------------------------------------------------------------- workers


def test_an_embedded_worker_runs_no_more_than_the_limit_at_once(scratch_modules, start_worker, tmp_path):
    """One worker, a pool of 6 threads: its claims alone must keep to the limit."""
    _, flows = flows_app(scratch_modules, limit=2)
    log = str(tmp_path / "log")
    with transaction.atomic():
        limited = [schedule(flows.limited, log, 2, 0.05) for _ in range(8)]
        others = [schedule(flows.unlimited, log) for _ in range(4)]
    start_worker(name="embedded", pool_size=6)

    wait_for(
        lambda: not Workflow.objects.exclude(status=S.COMPLETED).exists(),
        timeout=60,
        what="every run to complete",
    )
    assert overlap(log) == 2  # the limit, reached and never passed
    last_start = max(int(line[2]) for line in w.read_log(log) if line[0] == "start")
    assert all(int(line[2]) < last_start for line in w.read_log(log) if line[0] == "free")
    assert len(limited) + len(others) == Workflow.objects.filter(status=S.COMPLETED).count()


@pytest.mark.slow
def test_worker_processes_never_run_more_than_the_limit_at_once(spawn_worker, scratch_modules, tmp_path):
    """Three worker processes with four slots each, thirty runs of a workflow
    limited to five (more than one worker's pool: reaching the limit takes two
    workers), scheduled at once while every worker waits idle (on PostgreSQL
    one NOTIFY wakes all three together), and unlimited runs after them."""
    if connection.vendor == "sqlite":
        pytest.skip("several worker processes: PostgreSQL and MariaDB (SQLite: the embedded worker test)")
    app, flows = flows_app(scratch_modules, limit=5)
    log = str(tmp_path / "log")
    env = {
        "DJANGO_SETTINGS_MODULE": scratch_modules.settings_with(app),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(scratch_modules.root)]),
    }
    names = ["lim-a", "lim-b", "lim-c"]
    workers = [spawn_worker(name, "--pool", "4", "--poll", "0.1", extra_env=env) for name in names]
    wait_until_up(names)
    with transaction.atomic():
        limited = [schedule(flows.limited, log, 5, 0.2) for _ in range(30)]
        others = [schedule(flows.unlimited, log) for _ in range(10)]

    wait_for(
        lambda: not Workflow.objects.exclude(status=S.COMPLETED).exists(),
        timeout=120,
        interval=0.2,
        what="all 40 runs to complete",
    )
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(30) == 0, worker.log()

    starts = Counter(line[1] for line in w.read_log(log) if line[0] == "start")
    assert starts == Counter({str(run.id): 1 for run in limited})  # each ran once
    assert overlap(log) == 5, [worker.log() for worker in workers]
    last_start = max(int(line[2]) for line in w.read_log(log) if line[0] == "start")
    free = [int(line[2]) for line in w.read_log(log) if line[0] == "free"]
    assert len(free) == len(others) and max(free) < last_start  # not held up behind the limit


def test_the_start_up_line_names_the_limits(scratch_modules, start_worker, caplog):
    name = declare(scratch_modules, limit=3)
    with caplog.at_level("INFO", logger="everystep"):
        worker = start_worker(name="limits-line", stop_when_idle=True)
        worker.thread.join(30)
    [started] = [record.getMessage() for record in caplog.records if "started:" in record.getMessage()]
    assert started.endswith(f"; at most running: {name} 3")


def test_the_peek_and_the_claim_of_a_limited_workflow_use_its_index_on_postgresql(scratch_modules):
    """The limited workflow's peek and claim are probes of its index, reading a
    few pages however long the backlog of other workflows waiting ahead of its
    runs. The table has a realistic shape and the statistics are this test's
    own (VACUUM ANALYZE reads every row of a table this size), so the plans do
    not depend on what earlier tests left behind."""
    if database.connection().vendor != "postgresql":
        pytest.skip("the partial index is PostgreSQL's (MySQL gets a (status, name, created_at) index)")
    name = declare(scratch_modules, limit=2)
    start = timezone.now() - dt.timedelta(days=1)

    def run(flow, seconds, status=S.SCHEDULED):
        at = start + dt.timedelta(seconds=seconds)
        return Workflow(
            name=flow,
            args=[],
            status=status,
            created_at=at,
            completed_at=None if status == S.SCHEDULED else at,
        )

    # A day's history: other workflows' finished runs, and some of this one's.
    # Some: PostgreSQL estimates the workflow's share of the waiting runs by its
    # share of the whole table (name and status taken as independent), and with
    # a history of a few percent of the table (500 runs here) it picks the
    # unlimited claim's index for the claim, and walks the backlog.
    history = [run(f"shop.flow_{i % 7}", i, S.COMPLETED) for i in range(5_000)]
    history += [run(name, 100 * i, S.COMPLETED) for i in range(50)]
    # Its waiting runs come after the backlog of the others (below): a claim
    # that walked the scheduled runs in order (the unlimited claim's index)
    # would pass over all of it.
    Workflow.objects.bulk_create([*history, *(run(name, 20 * 3600 + i) for i in range(5))], batch_size=2_000)

    for backlog in (2_000, 20_000):
        waiting = Workflow.objects.filter(status=S.SCHEDULED).exclude(name=name).count()
        others = (run(f"shop.flow_{i % 7}", 2 * 3600 + i) for i in range(waiting, backlog))
        Workflow.objects.bulk_create(others, batch_size=2_000)
        plans, reads = limited_claim_plans(name)
        for what, plan in plans.items():
            assert "everystep_workflow_limit_idx" in plan, f"{what}, {backlog} others waiting:\n{plan}"
        # A probe reads a few pages: an index's root and leaf, the table's pages
        # of the rows it returns (and, for the peek, the running runs' count).
        # Passing over the backlog reads page after page of it.
        assert max(reads.values()) <= 12, (backlog, reads)


def limited_claim_plans(name) -> tuple[dict[str, str], dict[str, int]]:
    """Freshly analysed statistics, then one claim of workflow ``name``: the
    plan of its peek and of its claim, and how many pages each reads. The
    claimed runs are put back."""
    engine_db = database.connection()
    with engine_db.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE everystep_workflow")  # also what autovacuum would leave
    with CaptureQueriesContext(engine_db) as captured:
        claimed = limits.claim_limited("plans", 2, (), {name: 2})
    assert len(claimed) == 2
    Workflow.objects.filter(id__in=[run.id for run in claimed]).update(status=S.SCHEDULED, claimed_by=None)
    sqls = [query["sql"] for query in captured.captured_queries]
    [peek] = [sql for sql in sqls if "MIN(created_at)" in sql]
    [claim] = [sql for sql in sqls if "FOR UPDATE SKIP LOCKED" in sql]
    plans, reads = {}, {}
    with engine_db.cursor() as cursor:
        for what, sql in (("peek", peek), ("claim", claim)):
            cursor.execute(f"EXPLAIN {sql}")
            plans[what] = "\n".join(row[0] for row in cursor.fetchall())
            # ANALYZE runs it: the claim's statement locks the rows, and the
            # transaction (autocommit) lets them go at once.
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, SUMMARY OFF) {sql}")
            executed = "\n".join(row[0] for row in cursor.fetchall())
            total = re.search(r"Buffers: shared ([^\n]*)", executed)  # the top node's: the whole statement
            reads[what] = sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", total.group(1)))
    return plans, reads


def test_a_declared_limit_costs_a_claim_of_other_runs_one_query(scratch_modules, django_assert_num_queries):
    declare(scratch_modules, limit=2)  # nothing of it waits
    add_runs("tests.worker.workflows.chain", 3)
    engine_db = database.connection()
    # The plain claim as test_claims pins it: one statement on SQLite, a transaction
    # on MariaDB/MySQL, and on PostgreSQL a prepared statement Django does not log.
    plain = {"sqlite": 1, "mysql": 4, "postgresql": 0}[engine_db.vendor]
    with django_assert_num_queries(1 + plain, connection=engine_db):
        assert len(claims.claim_runs("w1", 4)) == 3


def test_a_limited_run_claimed_before_a_failing_claim_is_still_executed(
    scratch_modules, start_worker, monkeypatch
):
    """The limited runs are claimed (committed) before the others: when the
    claim of the others fails (SQLite "database is locked", a MariaDB deadlock,
    a connection lost), the limited ones must still be executed, not left
    running under a live worker, holding their workflow's slots for the fleet."""

    def export_ledger():
        return "exported"

    export_ledger.__module__ = f"{scratch_modules.prefix}.flows"
    name = workflow(max_concurrent=1)(export_ledger).__everystep__.name
    run = Workflow.objects.create(name=name, args=[])
    failures = []
    for vendor_claim in ("_claim_postgresql", "_claim_sqlite", "_claim_mysql"):
        real = getattr(claims, vendor_claim)

        def failing_once(*args, real=real, **kwargs):
            if not failures:
                failures.append(None)
                raise OperationalError("database is locked")
            return real(*args, **kwargs)

        monkeypatch.setattr(claims, vendor_claim, failing_once)

    start_worker(name="w1", pool_size=2)
    wait_for(lambda: failures, what="the claim of the unlimited runs to fail once")
    wait_for(
        lambda: Workflow.objects.get(id=run.id).status == S.COMPLETED,
        timeout=10,
        what=f"the limited run to be executed (it is {Workflow.objects.get(id=run.id).status} "
        f"under {Workflow.objects.get(id=run.id).claimed_by!r})",
    )
