"""The engine behind a real PgBouncer in transaction pooling. Each test starts
its own PgBouncer (tests/throwaway_pgbouncer.py) in front of the suite's
PostgreSQL server; runs the PostgreSQL pass only.

Two ways, where it matters (``BOTH``): prepared statements off
(EVERYSTEP_PREPARED_STATEMENTS = False), as PgBouncer before 1.21 needs
(Debian 12's is 1.18); and on, the default, through a PgBouncer that keeps
them (1.21 or later with ``max_prepared_statements``; scripts/pgbouncer builds
1.24.1 where none is installed).

The test process reaches everystep's test database through PgBouncer too (the
alias ``bounced``: ``schedule()``, the operations and the checks below), and so
do the worker subprocesses; their LISTEN connection goes straight to PostgreSQL
(EVERYSTEP_LISTEN_DATABASE), unless a test says otherwise."""

from collections import Counter, defaultdict
from types import SimpleNamespace

import pytest
from django.db import connections, transaction
from django.db.utils import load_backend
from django.test import override_settings

from everystep import database, operations, send_event, statements, step, workflow
from everystep.api import schedule
from everystep.models import Step, Workflow
from tests.helpers import run_once
from tests.settings import database_from_url
from tests.worker import workflows as w
from tests.worker.support import database_url, wait_for

S = Workflow.Status
BOUNCED = "bounced"  # the test process's alias for everystep's database, through PgBouncer


class ToBounced:
    """A database router: every query of the test process goes through PgBouncer."""

    def db_for_read(self, model, **hints):
        return BOUNCED

    def db_for_write(self, model, **hints):
        return BOUNCED


def _wrapper(url: str, alias: str):
    both = {"default": connections.settings["default"], alias: database_from_url(url)}
    config = connections.configure_settings(both)[alias]  # Django's defaults filled in
    return load_backend(config["ENGINE"]).DatabaseWrapper(config, alias)


# Parametrizes ``bounced``: prepared statements off (PgBouncer 1.18's way), then on.
BOTH = pytest.mark.parametrize("bounced", [False, True], ids=["unprepared", "prepared"], indirect=True)
# Parametrizes ``bounced``: prepared statements on, through a PgBouncer that keeps them.
PREPARED = pytest.mark.parametrize("bounced", [True], ids=["prepared"], indirect=True)


@pytest.fixture
def bounced(request, start_pgbouncer, transactional_db):
    """A PgBouncer (2 server connections) in front of everystep's test database;
    the test process's queries go through it while the test runs. Yields the
    PgBouncer, the URLs, ``data`` (through it) and ``direct`` (not), and
    ``prepared``: whether the engine prepares its statements (``BOTH``; off
    unless parametrized)."""
    prepared = getattr(request, "param", False)
    bouncer = start_pgbouncer(pool_size=2, prepared_statements=prepared)
    direct = connections[database.alias()]
    urls = SimpleNamespace(
        bouncer=bouncer, data=bouncer.url(direct.settings_dict["NAME"]), direct=database_url(direct),
        prepared=prepared,
    )
    # A connection made here, not declared in DATABASES (see throwaway_database).
    connections[BOUNCED] = _wrapper(urls.data, BOUNCED)
    try:
        with override_settings(
            DATABASE_ROUTERS=[ToBounced()], EVERYSTEP_DATABASE=BOUNCED, EVERYSTEP_PREPARED_STATEMENTS=prepared
        ):
            yield urls
    finally:
        connections[BOUNCED].close()
        del connections[BOUNCED]


def worker_env(urls, *, listen_direct: bool = True, **extra) -> dict:
    env = {"EVERYSTEP_TEST_PREPARED_STATEMENTS": "1" if urls.prepared else "0", **extra}
    if listen_direct:
        env["EVERYSTEP_TEST_LISTEN_DATABASE_URL"] = urls.direct
    return env


def status_of(run) -> str:
    return Workflow.objects.filter(id=run.id).values_list("status", flat=True).get()


def all_ended(runs) -> bool:
    unended = Workflow.objects.filter(id__in=[run.id for run in runs], status__in=[S.SCHEDULED, S.RUNNING])
    return not unended.exists()


@BOTH
def test_the_engine_runs_through_pgbouncer(bounced, spawn_worker, tmp_path):
    """Schedule, run, stop, retry (a replay: the unsafe-to-repeat step is not run
    again), all through PgBouncer, by a worker whose data also goes through it."""
    log, gate = str(tmp_path / "log"), str(tmp_path / "gate")
    worker = spawn_worker("bounced-1", "--pool", "4", "--poll", "0.1",
                          database_url=bounced.data, extra_env=worker_env(bounced))
    chains = [schedule(w.chain, log, 3) for _ in range(6)]
    settle = schedule(w.settle, log, gate, 25)
    wait_for(lambda: all_ended(chains), timeout=60, what="the chains to end")
    assert [status_of(run) for run in chains] == [S.COMPLETED] * 6
    for run in Workflow.objects.filter(id__in=[r.id for r in chains]):
        assert run.result == [1, 2, 3]

    # The unsafe step is recorded; the body then waits between steps: stop it there.
    wait_for(lambda: Step.objects.filter(workflow_id=settle.id, step_id="1", status="done").exists(),
             what="the unsafe step to be recorded")
    operations.stop_run(settle.id, actor="test")
    assert status_of(settle) == S.STOPPED
    operations.retry_run(settle.id)
    open(gate, "w").close()
    wait_for(lambda: status_of(settle) == S.COMPLETED, timeout=60, what="the retried run to complete")
    assert Workflow.objects.get(id=settle.id).result == 25
    paid = [line for line in w.read_log(log) if line[1] == str(settle.id) and line[2] == "pay"]
    assert len(paid) == 1  # recorded before the stop: replayed, not run again
    steps = Counter(Step.objects.filter(workflow_id=settle.id).values_list("step_id", "status"))
    assert steps == {("1", "done"): 1, ("2", "done"): 1}
    assert worker.alive(), worker.log()
    assert "Traceback" not in worker.log(), worker.log()


def _listener_ready(urls) -> bool:
    """The worker's LISTEN connection has heard its own probe: its last statement
    (pg_stat_activity, seen straight on PostgreSQL) is the UNLISTEN that follows it."""
    import psycopg

    with psycopg.connect(urls.direct, autocommit=True) as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = %s",
            ["UNLISTEN everystep_probe"],
        ).fetchone()[0]
    return found > 0


def test_a_notify_through_pgbouncer_wakes_the_worker_on_its_direct_listen_connection(
    bounced, spawn_worker, tmp_path
):
    """The worker polls, beats and looks for stale workers every 10 minutes: it
    runs the new run because schedule()'s NOTIFY, sent through PgBouncer, reached
    its LISTEN connection, which goes straight to PostgreSQL."""
    log = str(tmp_path / "log")
    env = worker_env(
        bounced, EVERYSTEP_TEST_HEARTBEAT_INTERVAL="600", EVERYSTEP_TEST_RECOVER_STALE_AFTER="1800"
    )
    worker = spawn_worker("bounced-listen", "--poll", "600", database_url=bounced.data, extra_env=env)
    wait_for(lambda: _listener_ready(bounced), timeout=30, what="the worker's LISTEN connection")
    run = schedule(w.chain, log, 2)
    wait_for(lambda: status_of(run) == S.COMPLETED, timeout=10, what="the NOTIFY to wake the worker")
    assert "did not hear a NOTIFY" not in worker.log()


def test_listen_through_pgbouncer_is_detected_and_the_worker_polls(bounced, spawn_worker, tmp_path):
    """Without EVERYSTEP_LISTEN_DATABASE the LISTEN goes through PgBouncer, where it
    hears nothing: the worker says so, names the setting, and polls."""
    log = str(tmp_path / "log")
    worker = spawn_worker("bounced-deaf", "--poll", "0.2", database_url=bounced.data,
                          extra_env=worker_env(bounced, listen_direct=False))
    wait_for(lambda: "did not hear a NOTIFY" in worker.log(), timeout=30, what="the worker's warning")
    assert "EVERYSTEP_LISTEN_DATABASE" in worker.log()
    run = schedule(w.chain, log, 2)
    wait_for(lambda: status_of(run) == S.COMPLETED, timeout=30, what="polling to pick the run up")


@BOTH
def test_a_fleet_with_more_threads_than_server_connections_keeps_every_guarantee(
    bounced, spawn_worker, tmp_path
):
    """3 workers x pool 4 (12 run threads, 3 claim loops) share PgBouncer's 2
    server connections: clients wait for one, and still every run completes, each
    step is recorded and executed once, and no run is executed by two workers.
    PgBouncer's own figures show the clients waiting for a server connection."""
    log = str(tmp_path / "log")
    workers = [
        spawn_worker(f"fleet-{i}", "--pool", "4", "--poll", "0.1",
                     database_url=bounced.data, extra_env=worker_env(bounced))
        for i in range(3)
    ]
    # Steps of 50 ms: a worker that starts before the others cannot drain the
    # queue alone (about 2 s for one worker, under 1 s for the three).
    runs = [schedule(w.chain, log, 3, 0.05) for _ in range(60)]
    name = bounced.data.rsplit("/", 1)[1]
    wait_for(lambda: all_ended(runs), timeout=120, what="the fleet to end every run")
    # More clients than server connections (the workers still hold theirs), and
    # they waited for one: PgBouncer's total of that wait, which misses none of
    # them (a glance at its queue can, between two short statements).
    clients = [client for client in bounced.bouncer.show("CLIENTS") if client["database"] == name]
    assert len(clients) > 2, clients
    assert _stats(bounced.bouncer, name)["total_wait_time"] > 0

    ids = [run.id for run in runs]
    assert set(Workflow.objects.filter(id__in=ids).values_list("status", flat=True)) == {S.COMPLETED}
    recorded = Counter(Step.objects.filter(workflow_id__in=ids).values_list("workflow_id", "step_id"))
    assert len(recorded) == 60 * 3 and set(recorded.values()) == {1}
    started = Counter((line[1], line[2]) for line in w.read_log(log) if line[0] == "start")
    assert len(started) == 60 * 3 and set(started.values()) == {1}  # each step executed once
    ran_by = defaultdict(set)
    for _event, run_id, _index, claimer, _pid in w.read_log(log):
        ran_by[run_id].add(claimer)
    assert all(len(claimers) == 1 for claimers in ran_by.values())  # no run claimed twice
    assert len({claimer for claimers in ran_by.values() for claimer in claimers}) > 1  # a fleet, really
    assert len([s for s in bounced.bouncer.show("SERVERS") if s["database"] == name]) <= 2
    if bounced.prepared:
        # The statements were prepared, and PgBouncer kept them: each step's
        # insert went as an execution (a bind) of a prepared statement, and
        # PostgreSQL parsed the engine's few statements about once per server connection.
        stats = _stats(bounced.bouncer, name)
        assert stats["total_bind_count"] >= 60 * 3, stats
        assert stats["total_server_parse_count"] <= 2 * 10, stats
    for proc in workers:
        assert proc.alive(), proc.log()
        assert "Traceback" not in proc.log(), proc.log()


def _stats(bouncer, name: str) -> dict:
    """PgBouncer's ``SHOW STATS`` totals for database ``name``."""
    return next(row for row in bouncer.show("STATS") if row["database"] == name)


def test_the_cursor_path_prepares_nothing_of_psycopgs_behind_pgbouncer(start_pgbouncer, transactional_db):
    """PgBouncer 1.18 in transaction mode (or a later one that keeps no prepared
    statements) hands one server connection to two clients: a statement psycopg
    prepared for one (``_pg3_0``) would collide with the other's. everystep's
    cursor path binds on the server but prepares nothing (statements.execute),
    with the setting on or off."""
    bouncer = start_pgbouncer(pool_size=1)
    url = bouncer.url(connections[database.alias()].settings_dict["NAME"])
    first, second = _wrapper(url, "bounced_a"), _wrapper(url, "bounced_b")
    try:
        for prepared in (True, False):
            for i, conn in enumerate((first, second) * 2):
                rows = statements.execute(conn, "SELECT %s::int", [i], prepared=prepared, fetch=True)
                assert rows == [(i,)]
    finally:
        first.close()
        second.close()


def test_a_pgbouncer_that_keeps_prepared_statements_lets_clients_share_a_server_connection(
    start_pgbouncer, transactional_db
):
    """Two clients on one server connection, through PgBouncer 1.21+ with
    max_prepared_statements: each client's libpq statements are its own,
    whichever server connection it is lent. PostgreSQL parsed the statement
    once, on the one server connection; the cursor path's unprepared
    statements in between are no prepared statement of PgBouncer's."""
    bouncer = start_pgbouncer(pool_size=1, prepared_statements=True)
    url = bouncer.url(connections[database.alias()].settings_dict["NAME"])
    first, second = _wrapper(url, "bounced_a"), _wrapper(url, "bounced_b")
    plus_one = statements.Libpq("everystep_test_plus_one", "SELECT %s + 1", [statements.INT8])
    try:
        for i, conn in enumerate((first, second) * 3):
            assert statements.execute(conn, "SELECT %s::int", [i], prepared=True, fetch=True) == [(i,)]
            assert statements.fetch_libpq(conn, plus_one, [str(i)]) == [(i + 1,)]
        stats = _stats(bouncer, url.rsplit("/", 1)[1])
        # Each client prepared it once, PostgreSQL parsed it once; only the
        # libpq statement's 6 executions are binds of a prepared statement.
        assert (stats["total_client_parse_count"], stats["total_server_parse_count"]) == (2, 1), stats
        assert stats["total_bind_count"] == 6, stats
    finally:
        first.close()
        second.close()


def test_a_pooled_connection_keeps_its_prepared_statements_through_pgbouncer(
    start_pgbouncer, transactional_db
):
    """Django's connection pool lends one Django connection a different psycopg
    connection after each close. A statement must be prepared once per psycopg
    connection: PgBouncer (1.21+) cuts off a client that prepares a name it
    already has ("prepared statement name is already in use")."""
    bouncer = start_pgbouncer(pool_size=2, prepared_statements=True)
    url = bouncer.url(connections[database.alias()].settings_dict["NAME"])
    conn = _wrapper(url, "bounced_pooled")
    conn.settings_dict["OPTIONS"] = {"pool": {"min_size": 2, "max_size": 2}}
    plus_one = statements.Libpq("everystep_test_plus_one", "SELECT %s + 1", [statements.INT8])
    lent = []
    try:
        conn.pool.open(wait=True, timeout=30)  # both connections ready: the pool lends them in turn
        for i in range(6):
            assert statements.fetch_libpq(conn, plus_one, [str(i)]) == [(i + 1,)]
            lent.append(conn.connection)
            conn.close()  # back to the pool
        assert len({id(pg) for pg in lent}) == 2  # both of the pool's connections, in turn
        assert _stats(bouncer, url.rsplit("/", 1)[1])["total_client_parse_count"] == 2
    finally:
        conn.close_pool()


# ------------------------------------------------------------ a rollback on everystep's connection
#
# While psycopg holds a prepared statement of its own on a connection, every
# ROLLBACK or ROLLBACK TO SAVEPOINT there makes it send DEALLOCATE ALL, and
# PgBouncer (1.24.1 here) then forgets all of the client's statements,
# everystep's libpq ones included: the next step's insert was a bind of a
# name it no longer knew, it cut the client off ("prepared statement did not
# exist"), and the run went back to the queue with its step run again.
# In-process (run_once), through PgBouncer; the replay loads the run's
# outcomes (the statement that went through a prepared psycopg cursor)
# before the steps run.

EXECUTED = []


@step
def pgbouncer_plain_step():
    return 1


@step
def pgbouncer_tolerant_step():
    """Tries something on everystep's database and tolerates its failure (a rollback)."""
    EXECUTED.append("tolerant")
    try:
        with transaction.atomic(using=database.alias()):
            with database.connection().cursor() as cursor:
                cursor.execute("SELECT 1")  # say, an INSERT
            raise ValueError("say, an IntegrityError on a duplicate row")
    except ValueError:
        pass
    return "ok"


@workflow
def pgbouncer_tolerant():
    pgbouncer_plain_step()
    return pgbouncer_tolerant_step()


@PREPARED
def test_a_step_that_rolls_back_its_own_transaction_is_recorded_once_behind_pgbouncer(bounced):
    EXECUTED.clear()
    run = schedule(pgbouncer_tolerant)
    row = run_once(Workflow.objects.get(id=run.id))  # claim, replay (loads outcomes), both steps, the end
    assert (row.status, row.result, EXECUTED) == (S.COMPLETED, "ok", ["tolerant"])
    assert Step.objects.filter(workflow_id=run.id).count() == 2


SENT = []


@step
def pgbouncer_notify_step(other_id):
    """Sends an event that was already sent: send_event is idempotent per key
    (returns False), its duplicate insert rolled back to a savepoint."""
    SENT.append(send_event(other_id, "pgbouncer-done", 1))
    return "sent"


@workflow
def pgbouncer_notifier(other_id):
    pgbouncer_plain_step()
    return pgbouncer_notify_step(other_id)


@PREPARED
def test_a_step_resending_an_event_is_recorded_once_behind_pgbouncer(bounced):
    """The engine's own savepoint rollback (send_event's duplicate) did the same:
    psycopg's ROLLBACK TO SAVEPOINT also made it send DEALLOCATE ALL."""
    SENT.clear()
    other = schedule(pgbouncer_tolerant)
    assert send_event(other.id, "pgbouncer-done", 1)
    run = schedule(pgbouncer_notifier, str(other.id))
    row = run_once(Workflow.objects.get(id=run.id))
    assert (row.status, SENT) == (S.COMPLETED, [False])
    assert Step.objects.filter(workflow_id=run.id).count() == 2
