"""A worker's pool threads keep their connection to everystep's database from
one run to the next, replace one that died while idle, and close them when the
worker stops. On every backend; the dead connection is killed server-side
(PostgreSQL, MariaDB/MySQL)."""

import logging

import pytest

from everystep import database
from everystep.api import schedule
from everystep.models import Workflow
from tests.worker import workflows as w
from tests.worker.support import stop_and_join, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

S = Workflow.Status


def result_of(run):
    wait_for(lambda: Workflow.objects.get(id=run.id).status == S.COMPLETED, what=f"run {run.id} to complete")
    return Workflow.objects.get(id=run.id).result


def open_sessions(ids) -> set:
    """Which of the server sessions ``ids`` are still connected."""
    conn = database.connection()
    with conn.cursor() as cursor:
        if conn.vendor == "postgresql":
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [list(ids)])
        else:
            cursor.execute(
                f"SELECT id FROM information_schema.processlist WHERE id IN ({', '.join(['%s'] * len(ids))})",
                list(ids),
            )
        return {row[0] for row in cursor.fetchall()}


def kill_session(session) -> None:
    conn = database.connection()
    with conn.cursor() as cursor:
        if conn.vendor == "postgresql":
            cursor.execute("SELECT pg_terminate_backend(%s)", [session])
        else:
            cursor.execute(f"KILL {int(session)}")
    wait_for(lambda: not open_sessions([session]), what=f"session {session} to end")


def test_a_pool_thread_keeps_its_connection_from_one_run_to_the_next(start_worker):
    start_worker(pool_size=1)
    # One at a time: each run is claimed by the loop, after the pool thread went idle.
    sessions = [result_of(schedule(w.report_session)) for _ in range(3)]
    # A busy queue: the pool thread claims each next run itself.
    queued = [schedule(w.report_session) for _ in range(3)]
    sessions += [result_of(run) for run in queued]
    assert len(set(sessions)) == 1, sessions


def test_a_kept_connection_that_died_while_idle_is_replaced_before_the_next_run(
    start_worker, monkeypatch, caplog
):
    if database.connection().vendor == "sqlite":
        pytest.skip("a SQLite connection has no server session to kill")
    monkeypatch.setattr(database, "CHECK_IDLE_AFTER", 0.0)
    start_worker(pool_size=1)
    first = result_of(schedule(w.report_session))
    kill_session(first)  # as a database restart or an idle timeout would
    with caplog.at_level(logging.INFO, logger="everystep"):
        second = schedule(w.report_session)
        assert result_of(second) != first
    # The run went through on a new connection, not back to the queue.
    assert not [r for r in caplog.records if "unavailable" in r.getMessage() or "requeue" in r.getMessage()]


def test_a_stopped_worker_closes_the_connections_its_pool_threads_kept(start_worker):
    if database.connection().vendor == "sqlite":
        pytest.skip("a SQLite connection has no server session to look for")
    worker = start_worker(pool_size=2)
    sessions = {result_of(schedule(w.report_session)) for _ in range(2)}
    assert open_sessions(sessions) == sessions  # kept while the worker runs
    stop_and_join(worker)
    assert open_sessions(sessions) == set()
