"""Worker heartbeats and the recovery of a stale worker's runs, with real worker
processes and real signals (SIGKILL, SIGSTOP/SIGCONT) on every backend.

The worker processes get short settings (a heartbeat every 0.2 s, stale after
1.5 s) through the environment (tests/settings.py); the test process keeps the
defaults. Every wait is on an event: a row, a log line."""

import datetime as dt
import importlib.metadata
import re
import signal
import socket
import sqlite3
import threading
import time
import urllib.request

import pytest
from django.db import connection, connections
from django.db.backends.signals import connection_created
from django.test import override_settings
from django.utils import timezone

from everystep import claims, database, heartbeats, operations, statements
from everystep.api import schedule
from everystep.models import Heartbeat, Step, Wait, Workflow
from tests.worker import workflows as w
from tests.worker.support import free_port, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

S = Workflow.Status
FAST = {"EVERYSTEP_TEST_HEARTBEAT_INTERVAL": "0.2", "EVERYSTEP_TEST_RECOVER_STALE_AFTER": "1.5"}


def row(run) -> Workflow:
    return Workflow.objects.get(id=run.id)


def beat_of(name: str) -> Heartbeat | None:
    return Heartbeat.objects.filter(name=name).first()


def steps_of(run) -> list:
    return list(Step.objects.filter(workflow_id=run.id).values_list("step_id", "status", "result"))


def started_by(log, run, index) -> list:
    return [line[3] for line in w.read_log(log) if line[:3] == ("start", str(run.id), str(index))]


def ended_by(log, run, index) -> list:
    return [line[3] for line in w.read_log(log) if line[:3] == ("end", str(run.id), str(index))]


def open_gate(path) -> None:
    with open(path, "w"):
        pass


def make_heartbeat(name: str, *, seconds_ago: float = 0, **values) -> Heartbeat:
    """A heartbeat row as a worker would have written it ``seconds_ago`` (by the database's clock)."""
    heartbeats.beat(
        name,
        hostname=values.get("hostname", "host-x"),
        pid=values.get("pid", 4242),
        version="0.0",
        pool_size=4,
        started_at=timezone.now(),
        in_flight=0,
        executing={},
    )
    if seconds_ago:
        age(name, seconds_ago)
    return beat_of(name)


def age(name: str, seconds: float) -> None:
    """Make ``name``'s heartbeat ``seconds`` old, by the database's clock."""
    Heartbeat.objects.filter(name=name).update(last_seen=heartbeats.UtcNow() - dt.timedelta(seconds=seconds))


# ---------------------------------------------------------------- the heartbeat


def test_a_worker_keeps_a_heartbeat_and_deletes_it_when_it_stops(tmp_path, spawn_worker):
    log, gate = str(tmp_path / "log"), str(tmp_path / "gate")
    run = schedule(w.held, log, gate)
    worker = spawn_worker("beating", "--pool", "3", "--poll", "0.1", extra_env=FAST)
    wait_for(lambda: started_by(log, run, 1), what="step 1 to start")

    # It reports the run in flight and the step executing now.
    beat = wait_for(
        lambda: (b := beat_of("beating")) and b.executing == {str(run.id): ["1"]} and b,
        what="the heartbeat to report step 1",
    )
    assert (beat.hostname, beat.pid, beat.pool_size, beat.in_flight) == (
        socket.gethostname(), worker.process.pid, 3, 1,
    )
    assert beat.version == importlib.metadata.version("everystep")
    assert beat.started_at <= timezone.now()
    # Written again and again from the loop while the step runs, not per step.
    seen = {beat.last_seen}
    wait_for(lambda: seen.add(beat_of("beating").last_seen) or len(seen) >= 3, what="more heartbeats")

    open_gate(gate)
    wait_for(lambda: row(run).status == S.COMPLETED, what="the run to complete")
    # (The slot is free once the pool thread's claim of a next run found nothing.)
    wait_for(
        lambda: (b := beat_of("beating")).executing == {} and b.in_flight == 0,
        what="the heartbeat to report nothing in flight",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()
    assert beat_of("beating") is None  # stopped cleanly: gone, not stale


def test_a_restart_under_the_same_name_takes_the_heartbeat_over_and_keeps_its_runs(tmp_path, spawn_worker):
    # Stale after 30 s here: the restart comes back well before, and the other
    # worker, looking every 0.2 s, must leave the runs to it.
    slow_to_judge = {**FAST, "EVERYSTEP_TEST_RECOVER_STALE_AFTER": "30"}
    log, gate = str(tmp_path / "log"), str(tmp_path / "gate")
    run = schedule(w.held, log, gate)
    first = spawn_worker("steady", "--poll", "0.1", extra_env=slow_to_judge)
    wait_for(lambda: started_by(log, run, 1), what="step 1 to start")
    other = spawn_worker("other", "--poll", "0.1", extra_env=slow_to_judge)
    wait_for(lambda: beat_of("other"), what="the other worker's heartbeat")
    first.signal(signal.SIGKILL)
    first.wait(10)

    restarted = spawn_worker("steady", "--poll", "0.1", extra_env=slow_to_judge)
    wait_for(lambda: len(started_by(log, run, 1)) == 2, timeout=30, what="the restart to resume the run")
    open_gate(gate)
    wait_for(lambda: row(run).status == S.COMPLETED, timeout=30, what="the restart to finish the run")
    assert (row(run).claimed_by, row(run).result) == ("steady", "steady")
    assert "resuming 1 run(s) left running under its name" in restarted.log()
    assert beat_of("steady").pid == restarted.process.pid
    assert "requeued" not in other.log()
    for worker in (restarted, other):
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.log()


@override_settings(EVERYSTEP_PREPARED_STATEMENTS=False)  # PostgreSQL: every statement through Django's cursor
def test_the_step_hot_path_sends_no_more_statements_than_before(tmp_path, start_worker):
    """From its pool thread, a run of n steps sends one insert per step, its end,
    and the claim of the next run for the same slot (on PostgreSQL, the end and
    that claim in one statement); no load of its outcomes, as a claim says that
    a run claimed for the first time has none (MariaDB/MySQL's claim cannot:
    there it is loaded). However often the loop writes its heartbeat meanwhile;
    the heartbeat still reports the step executing now."""
    mysql = database.connection().vendor == "mysql"
    postgresql = database.connection().vendor == "postgresql"
    sent = []  # (thread name, statement)

    def count(execute, sql, params, many, context):
        sent.append((threading.current_thread().name, sql))
        return execute(sql, params, many, context)

    def install(sender, connection, **kwargs):
        if connection.alias == database.alias() and count not in connection.execute_wrappers:
            connection.execute_wrappers.append(count)

    connection_created.connect(install)
    try:
        worker = start_worker(name="counted", pool_size=1, heartbeat_interval=0.05, recover_stale_after=None)
        log = str(tmp_path / "log")
        setup = []  # per run: what the pool thread's new connection asked the server first
        for steps in (3, 6):
            del sent[:]
            run = schedule(w.chain, log, steps, 0.2)
            wait_for(
                lambda: (b := beat_of("counted")) and b.executing.get(str(run.id)),  # noqa: B023
                what="the heartbeat to report a step of the run",
            )
            wait_for(lambda: row(run).status == S.COMPLETED, what="the run to complete")  # noqa: B023
            # The pool thread's claim of a next run comes after the run's end; the
            # slot is handed back once that claim found nothing.
            wait_for(lambda: not worker._inflight, what="the pool thread to claim again and free its slot")
            on_run_thread = [sql for thread, sql in sent if thread.startswith("everystep-run")]
            # (MariaDB/MySQL: Django reads the server's version once per thread and
            # sets the isolation level once per connection.)
            setup.append([sql for sql in on_run_thread if "everystep_" not in sql])
            by_run_thread = [sql for sql in on_run_thread if "everystep_" in sql]
            inserts = [sql for sql in by_run_thread if sql.startswith(statements.INSERT_STEP)]
            ends = [sql for sql in by_run_thread if sql.startswith(statements.FINISH_RUN)]
            loads = [sql for sql in by_run_thread if sql.startswith(statements.LOAD_OUTCOMES)]
            with_claim = [sql for sql in by_run_thread if sql == claims.FINISH_AND_CLAIM]
            claim = [sql for sql in by_run_thread if sql not in inserts + ends + loads + with_claim]
            if postgresql:
                assert (len(inserts), len(with_claim), len(ends), len(loads), len(claim)) == (
                    steps, 1, 0, 0, 0
                ), by_run_thread
            else:
                assert (len(inserts), len(ends), len(loads)) == (steps, 1, 1 if mysql else 0), by_run_thread
                # UPDATE ... RETURNING; MariaDB/MySQL: SELECT ... FOR UPDATE (an empty queue: no UPDATE).
                assert len(claim) == 1 and "UPDATE" in claim[0], claim
            assert not any("everystep_heartbeat" in sql for sql in by_run_thread)
            beats = [sql for thread, sql in sent if thread == "worker-counted" and "heartbeat" in sql]
            assert len(beats) >= 2  # the loop kept beating while the steps ran
        # Whatever else a run thread sent is session set-up, and does not grow with the steps.
        session = ("SET ", "SELECT VERSION()")
        assert all(sql.lstrip().startswith(session) for sql in setup[0] + setup[1]), setup
        assert len(setup[1]) <= len(setup[0]) <= 2, setup
    finally:
        connection_created.disconnect(install)


# ---------------------------------------------------------------- recovery


def test_a_killed_workers_runs_are_recovered_by_a_live_worker(tmp_path, spawn_worker):
    log, gate = str(tmp_path / "log"), str(tmp_path / "gate")
    runs = [schedule(w.held, log, gate) for _ in range(2)]
    victim = spawn_worker("victim", "--pool", "2", "--poll", "0.1", extra_env=FAST)
    wait_for(lambda: all(started_by(log, run, 1) for run in runs), what="both runs to start")
    metrics = free_port()
    rescuer = spawn_worker(
        "rescuer", "--poll", "0.1", "--metrics-port", str(metrics), "--metrics-bind", "127.0.0.1",
        extra_env=FAST,
    )
    wait_for(lambda: beat_of("rescuer"), what="the rescuer's heartbeat")
    assert all(row(run).claimed_by == "victim" for run in runs)  # the victim is live: nothing taken

    victim.signal(signal.SIGKILL)
    victim.wait(10)
    wait_for(
        lambda: all(started_by(log, run, 1) == ["victim", "rescuer"] for run in runs),
        timeout=30,
        what="the rescuer to take both runs over",
    )
    found = re.search(r"requeued 2 run\(s\) of worker 'victim', silent for ([\d.]+)s", rescuer.log())
    assert found, rescuer.log()
    assert float(found[1]) >= 1.5  # not before the limit
    open_gate(gate)
    wait_for(lambda: all(row(run).status == S.COMPLETED for run in runs), what="both runs to complete")
    assert all(row(run).result == "rescuer" for run in runs)
    assert all(ended_by(log, run, 2) == ["rescuer"] for run in runs)

    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
    assert 'everystep_runs_recovered_total{runner="rescuer"} 2.0' in body, body
    assert re.search(r'^everystep_worker_last_heartbeat_seconds\{runner="rescuer"} \S+$', body, re.M)
    # The dead worker's row stays, stale, holding nothing.
    assert Heartbeat.objects.stale(1.5).filter(name="victim").exists()
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait(30) == 0, rescuer.log()


def test_a_paused_worker_loses_its_runs_and_is_fenced_when_it_wakes(tmp_path, spawn_worker):
    log, gate = str(tmp_path / "log"), str(tmp_path / "gate")
    run = schedule(w.held, log, gate)
    sleeper = spawn_worker("sleeper", "--poll", "0.1", extra_env=FAST)
    wait_for(lambda: started_by(log, run, 1) == ["sleeper"], what="step 1 to start")
    pause(sleeper)
    try:
        rescuer = spawn_worker("rescuer", "--poll", "0.1", extra_env=FAST)
        wait_for(
            lambda: started_by(log, run, 1) == ["sleeper", "rescuer"], timeout=30,
            what="the rescuer to take the run over",
        )
        open_gate(gate)
        wait_for(lambda: row(run).status == S.COMPLETED, what="the rescuer to complete the run")
    finally:
        sleeper.signal(signal.SIGCONT)
    recorded = steps_of(run)
    assert recorded == [("1", "done", "rescuer"), ("2", "done", 2)]

    # Awake, the sleeper's step 1 returns (its gate is open) and its record is
    # fenced out: the run is no longer running under its name.
    wait_for(lambda: ended_by(log, run, 1) == ["rescuer", "sleeper"], what="the sleeper's step to end")
    fenced = f"run {run.id} is no longer running under 'sleeper'; step 1 was not recorded"
    wait_for(lambda: fenced in sleeper.log(), what="the sleeper to be fenced")
    first = beat_of("sleeper").last_seen
    wait_for(lambda: beat_of("sleeper").last_seen > first, what="the sleeper's next heartbeat")
    assert sleeper.alive(), sleeper.log()
    # It wrote nothing more, and started no further step.
    assert steps_of(run) == recorded
    assert started_by(log, run, 2) == ["rescuer"]
    assert (row(run).status, row(run).claimed_by, row(run).result) == (S.COMPLETED, "rescuer", "rescuer")
    assert beat_of("sleeper").executing == {}
    for worker in (sleeper, rescuer):
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.log()


def test_runs_of_a_claimer_that_writes_no_heartbeat_are_never_taken(tmp_path, spawn_worker):
    log = str(tmp_path / "log")
    old = schedule(w.chain, log, 1)
    Workflow.objects.filter(id=old.id).update(status=S.RUNNING, claimed_by="old-version")
    ghost = schedule(w.chain, log, 1)
    Workflow.objects.filter(id=ghost.id).update(status=S.RUNNING, claimed_by="ghost")
    make_heartbeat("ghost", seconds_ago=3600)

    rescuer = spawn_worker("rescuer", "--poll", "0.1", extra_env=FAST)
    # The stale worker's run is taken; in the same look, the other is left alone.
    wait_for(lambda: row(ghost).status == S.COMPLETED, timeout=30, what="the ghost's run to be recovered")
    assert "requeued 1 run(s) of worker 'ghost'" in rescuer.log()
    assert (row(old).status, row(old).claimed_by) == (S.RUNNING, "old-version")
    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait(30) == 0, rescuer.log()
    assert (row(old).status, row(old).claimed_by) == (S.RUNNING, "old-version")


def test_recovery_can_be_turned_off(tmp_path, spawn_worker):
    ghost = schedule(w.chain, str(tmp_path / "log"), 1)
    Workflow.objects.filter(id=ghost.id).update(status=S.RUNNING, claimed_by="ghost")
    make_heartbeat("ghost", seconds_ago=3600)
    off = {**FAST, "EVERYSTEP_TEST_RECOVER_STALE_AFTER": "None"}
    worker = spawn_worker("idle", "--poll", "0.1", extra_env=off)
    wait_for(lambda: beat_of("idle"), what="its heartbeat")
    # Several heartbeats later (each would be followed by a look at the others) ...
    seen = set()
    wait_for(lambda: seen.add(beat_of("idle").last_seen) or len(seen) >= 5, what="five heartbeats")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()
    assert (row(ghost).status, row(ghost).claimed_by) == (S.RUNNING, "ghost")


# ---------------------------------------------------------------- the guarded transition


def test_the_transition_requeues_only_while_the_heartbeat_is_stale():
    mine = Workflow.objects.create(name="x", status=S.RUNNING, claimed_by="w1")
    other = Workflow.objects.create(name="x", status=S.RUNNING, claimed_by="w2")
    make_heartbeat("w1")
    assert operations.requeue_stale_worker("w1", 60) == []  # fresh
    assert operations.requeue_stale_worker("nobody", 60) == []  # no heartbeat at all
    age("w1", 61)
    assert operations.requeue_stale_worker("w1", 60) == [mine.id]
    assert (row(mine).status, row(mine).claimed_by) == (S.SCHEDULED, None)
    assert (row(other).status, row(other).claimed_by) == (S.RUNNING, "w2")
    assert operations.requeue_stale_worker("w1", 60) == []  # nothing left


@pytest.mark.parametrize(
    "before, after", [("+01:00", "+02:00"), ("+02:00", "+01:00")], ids=["spring", "autumn"]
)
def test_a_dst_switch_of_the_database_session_zone_changes_no_age(before, after):
    """MySQL/MariaDB with ``time_zone = SYSTEM`` on a host with daylight saving
    time: the session's offset changes between a beat and the look at it (here
    by SET time_zone, with no time zone tables needed). In spring a live worker
    keeps its runs; in autumn a dead one loses them on time, not an hour late."""
    engine_db = database.connection()  # the session that beats and looks
    if engine_db.vendor != "mysql":
        pytest.skip("MySQL/MariaDB: its NOW() follows the session time zone")
    live = Workflow.objects.create(name="x", status=S.RUNNING, claimed_by="w-live")
    dead = Workflow.objects.create(name="x", status=S.RUNNING, claimed_by="w-dead")
    try:
        with engine_db.cursor() as cursor:
            cursor.execute("SET time_zone = %s", [before])
        make_heartbeat("w-live")
        make_heartbeat("w-dead", seconds_ago=61)
        with engine_db.cursor() as cursor:
            cursor.execute("SET time_zone = %s", [after])
        ages = {name: seconds for name, seconds, _ in heartbeats.others("me")}
        assert ages["w-live"] < 10 and 60 < ages["w-dead"] < 70, ages
        assert operations.requeue_stale_worker("w-live", 60) == []
        assert operations.requeue_stale_worker("w-dead", 60) == [dead.id]
    finally:
        with engine_db.cursor() as cursor:
            cursor.execute("SET time_zone = DEFAULT")
    assert (row(live).status, row(dead).status) == (S.RUNNING, S.SCHEDULED)


def test_a_heartbeat_written_while_the_recovery_waits_keeps_the_runs():
    """The heartbeat row is locked before the runs are touched: a recovery that
    waits on a beat in progress sees the beat, and takes nothing."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite runs one writer at a time: the recovery's transaction cannot begin during a beat")
    run = Workflow.objects.create(name="x", status=S.RUNNING, claimed_by="w1")
    make_heartbeat("w1", seconds_ago=3600)
    beating, release = threading.Event(), threading.Event()
    taken = []

    def beat():
        try:
            with database.atomic():
                Heartbeat.objects.filter(name="w1").update(last_seen=heartbeats.UtcNow())
                beating.set()
                release.wait(30)
        finally:
            connections.close_all()

    def recover():
        try:
            taken.extend(operations.requeue_stale_worker("w1", 60))
        finally:
            connections.close_all()

    beater = threading.Thread(target=beat)
    beater.start()
    recoverer = threading.Thread(target=recover)
    try:
        beating.wait(30)
        recoverer.start()
        wait_for(
            lambda: sessions_waiting_on_a_lock() or not recoverer.is_alive(),
            interval=0.2,  # MariaDB refreshes innodb_trx only when read 0.1 s after the last read
            what="the recovery to wait on the heartbeat's lock (or to be done)",
        )
    finally:
        release.set()
        beater.join(30)
        if recoverer.ident is not None:
            recoverer.join(30)
    assert taken == []
    assert (row(run).status, row(run).claimed_by) == (S.RUNNING, "w1")


def sessions_waiting_on_a_lock() -> int:
    engine_db = database.connection()  # where the heartbeats are
    with engine_db.cursor() as cursor:
        if engine_db.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM information_schema.innodb_trx t JOIN information_schema.processlist p "
                "ON p.id = t.trx_mysql_thread_id WHERE p.db = DATABASE() AND t.trx_state = 'LOCK WAIT'"
            )
        return cursor.fetchone()[0]


# ---------------------------------------------------------------- pausing a process


def pause(worker, attempts: int = 100) -> None:
    """SIGSTOP ``worker`` at a moment it is inside no transaction. A process
    paused mid-transaction would hold its locks and stall every other session,
    which is another story than the one under test (a worker that stopped
    beating); so a pause that lands in one is undone and tried again."""
    for _ in range(attempts):
        worker.signal(signal.SIGSTOP)
        wait_for(lambda: process_state(worker.process.pid) == "T", what="the process to stop")
        if not others_in_a_transaction():
            return
        worker.signal(signal.SIGCONT)
        time.sleep(0.01)  # let it finish the transaction (not a synchronisation)
    raise AssertionError(f"could not pause {worker.name} outside a transaction")


def process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def others_in_a_transaction() -> bool:
    """Whether another session of everystep's test database is inside a
    transaction (or, on SQLite, holds the write lock)."""
    engine_db = database.connection()
    if engine_db.vendor == "sqlite":
        probe = sqlite3.connect(engine_db.settings_dict["NAME"], timeout=0.05)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return False
        except sqlite3.OperationalError:
            return True
        finally:
            probe.close()
    with engine_db.cursor() as cursor:
        if engine_db.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
            )
        else:
            # MariaDB/MySQL refresh innodb_trx only for a read 0.1 s or more after
            # the previous one: a quicker read sees the old snapshot.
            time.sleep(0.15)
            cursor.execute(
                "SELECT count(*) FROM information_schema.innodb_trx t JOIN information_schema.processlist p "
                "ON p.id = t.trx_mysql_thread_id WHERE p.db = DATABASE() AND p.id <> CONNECTION_ID()"
            )
        return cursor.fetchone()[0] > 0


def age_of(name: str) -> float | None:
    beat = Heartbeat.objects.filter(name=name).with_age().first()
    return None if beat is None else beat.age.total_seconds()


def test_a_worker_waking_many_due_runs_keeps_the_run_it_executes(tmp_path, spawn_worker):
    """Waking a backlog of due runs (some tens of thousands at this 1.5 s limit,
    about a million at the default 60 s: a campaign's runs all sleeping until
    9:00) must not keep the loop from its heartbeat: the others would requeue
    the run it executes, then run on two workers at once."""
    if connection.vendor == "sqlite":
        # Both workers then execute the woken runs: at this 1.5 s limit, a beat
        # can wait that long for the one write lock, with or without the waking.
        pytest.skip("SQLite runs one writer at a time: a busy fleet's beats wait for the write lock")
    log = str(tmp_path / "log")
    # Written before the workers start (on SQLite, their writes would wait for this
    # insert's lock); due only later, all at once (a sleep_until shared by all of them).
    later = timezone.now() + dt.timedelta(days=1)
    sleepers = [
        Workflow(name="tests.worker.workflows.chain", args=[log, 0], status=S.WAITING) for _ in range(30_000)
    ]
    Workflow.objects.bulk_create(sleepers, batch_size=1000)
    Wait.objects.bulk_create(
        [Wait(run_id=r.id, step_id="1", kind="time", wake_at=later) for r in sleepers], batch_size=1000
    )
    run = schedule(w.chain, log, 1, 600)  # one long step
    busy = spawn_worker("busy", "--pool", "2", "--poll", "0.1", extra_env=FAST)
    wait_for(lambda: started_by(log, run, 1), what="step 1")
    # Another worker, up before the runs come due. Its long --poll keeps it out of
    # the waking (it looks for due runs once a poll), so that the busy one does
    # it all; it still beats and looks at the others every 0.2 s. (With both
    # waking, whichever finishes first takes the other's runs.)
    other = spawn_worker("other", "--poll", "86400", extra_env=FAST)
    wait_for(lambda: age_of("other") is not None, timeout=60, what="the other worker's heartbeat")

    Wait.objects.update(wake_at=timezone.now() - dt.timedelta(seconds=1))
    # The busy worker's loop wakes them all (the other one looks every 0.2 s meanwhile).
    wait_for(lambda: not Wait.objects.exists(), timeout=120, interval=0.2, what="every due run to be woken")
    wait_for(lambda: (age_of("busy") or 99) < 1.0, timeout=60, what="the busy worker's next heartbeat")
    assert busy.alive()

    after = row(run)
    assert (after.status, after.claimed_by) == (S.RUNNING, "busy"), other.log()[-2000:]
    for worker in (busy, other):
        worker.signal(signal.SIGKILL)


def test_an_absurd_pool_size_is_refused_at_start_not_a_worker_that_never_stops(spawn_worker, tmp_path):
    # A typo (3000000000) would be a worker whose heartbeat never fits pool_size
    # (a 4-byte integer), so its runs are never recovered, and which at SIGTERM
    # never exits (_close_pool_connections submits one task per pool slot).
    run = schedule(w.chain, str(tmp_path / "log"), 2)
    worker = spawn_worker("huge", "--pool", "3000000000", "--poll", "0.1", extra_env=FAST)
    wait_for(
        lambda: not worker.alive() or row(run).status == S.COMPLETED,
        timeout=30, what="the run to complete or the worker to refuse the option",
    )
    if not worker.alive():  # refused at start: what should happen
        assert "--pool" in worker.log() or "pool size" in worker.log(), worker.log()
        return
    wait_for(lambda: Heartbeat.objects.filter(name="huge").exists(), timeout=5,
             what=f"the worker's heartbeat; its log: {worker.log()[-300:]}")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()
