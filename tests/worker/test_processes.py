"""Real worker processes (``python -m django everystep_worker``), real signals."""

import re
import signal
import subprocess
import urllib.request
from collections import Counter

import pytest
from django.db import connection, connections, transaction

from everystep.api import schedule
from everystep.models import Workflow
from tests.worker import workflows as w
from tests.worker.support import THROWAWAY, free_port, wait_for, wait_until_up

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

S = Workflow.Status


def runs_of(log, event) -> Counter:
    """How often each (run, step index) logged ``event``."""
    return Counter((line[1], line[2]) for line in w.read_log(log) if line[0] == event)


def started_by(log, run_id, index) -> list:
    return [line[3] for line in w.read_log(log) if line[:3] == ("start", str(run_id), str(index))]


def row(run) -> Workflow:
    return Workflow.objects.get(id=run.id)


def test_sigterm_mid_step_requeues_and_another_worker_finishes(tmp_path, spawn_worker):
    log = str(tmp_path / "log")
    run = schedule(w.chain, log, 3, 1.0)
    first = spawn_worker("first", "--poll", "0.1")
    wait_for(lambda: started_by(log, run.id, 1), timeout=30, what="step 1 to start")

    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0, first.log()
    after = row(run)
    assert (after.status, after.claimed_by) == (S.SCHEDULED, None), first.log()  # nothing left claimed
    assert list(after.steps.values_list("step_id", flat=True)) == ["1"]  # the step in flight was recorded

    second = spawn_worker("second", "--poll", "0.1")
    wait_for(lambda: row(run).status == S.COMPLETED, timeout=30, what="the second worker to finish the run")
    assert row(run).result == [1, 2, 3]
    assert row(run).claimed_by == "second"
    key = str(run.id)
    assert runs_of(log, "start") == {(key, "1"): 1, (key, "2"): 1, (key, "3"): 1}  # every step once
    assert runs_of(log, "end") == runs_of(log, "start")
    assert started_by(log, run.id, 2) == ["second"]
    second.signal(signal.SIGTERM)
    assert second.wait(30) == 0


def test_sigkill_mid_step_is_resumed_by_a_restart_under_the_same_name(tmp_path, spawn_worker):
    log = str(tmp_path / "log")
    run = schedule(w.chain, log, 3, 1.0)
    worker = spawn_worker("steady", "--poll", "0.1")
    wait_for(lambda: started_by(log, run.id, 2), timeout=30, what="step 2 to start")

    worker.signal(signal.SIGKILL)
    worker.wait(10)
    assert (row(run).status, row(run).claimed_by) == (S.RUNNING, "steady")  # parked under its name

    restarted = spawn_worker("steady", "--poll", "0.1")
    wait_for(lambda: row(run).status == S.COMPLETED, timeout=30, what="the restart to resume the run")
    key = str(run.id)
    # Step 2 was killed mid-sleep: it started twice and ended once; the others ran once.
    assert runs_of(log, "start") == {(key, "1"): 1, (key, "2"): 2, (key, "3"): 1}
    assert runs_of(log, "end") == {(key, "1"): 1, (key, "2"): 1, (key, "3"): 1}
    restarted.signal(signal.SIGTERM)
    assert restarted.wait(30) == 0


def test_several_workers_share_the_queue_without_claiming_a_run_twice(tmp_path, spawn_worker):
    if connection.vendor != "postgresql":
        pytest.skip("many workers on one database: the PostgreSQL deployment")
    log = str(tmp_path / "log")
    names = ["w0", "w1", "w2"]
    workers = [spawn_worker(name, "--pool", "4", "--poll", "0.1") for name in names]
    wait_until_up(names)  # before the runs: all three contend for the queue
    with transaction.atomic():
        runs = [schedule(w.chain, log, 2) for _ in range(200)]
    wait_for(
        lambda: not Workflow.objects.exclude(status=S.COMPLETED).exists(),
        timeout=90,
        interval=0.2,
        what="all 200 runs to complete",
    )
    starts = runs_of(log, "start")
    assert len(starts) == 400 and set(starts.values()) == {1}  # each step of each run executed once
    assert Counter(Workflow.objects.values_list("status", flat=True)) == {S.COMPLETED: len(runs)}
    by_worker = Counter(line[3] for line in w.read_log(log) if line[0] == "start")
    assert sum(by_worker.values()) == 400
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(30) == 0, worker.log()
    assert not Workflow.objects.filter(status=S.RUNNING).exists()


def test_a_database_restart_does_not_lose_runs_or_the_worker(
    tmp_path, throwaway_postgres, throwaway_database, spawn_worker
):
    """The worker runs on a PostgreSQL server the test started for itself, and
    that server is restarted under it; the server the suite was given is not."""
    given_server_started = postmaster_start_time("default")
    log = str(tmp_path / "log")
    runs = [schedule(w.chain, log, 4, 0.3) for _ in range(3)]
    metrics = free_port()
    worker = spawn_worker(
        "survivor", "--pool", "4", "--poll", "0.1", "--metrics-port", str(metrics),
        "--metrics-bind", "127.0.0.1", database_url=throwaway_database,
    )
    wait_for(lambda: runs_of(log, "end"), timeout=30, what="the first step to end")

    started = throwaway_postgres.start_time()
    throwaway_postgres.restart()
    assert throwaway_postgres.start_time() > started
    connections[THROWAWAY].close()  # the restart cut off the test's own session too
    late = schedule(w.chain, log, 1)  # claimed by the worker after the restart

    wait_for(
        lambda: not Workflow.objects.exclude(status=S.COMPLETED).exists(),
        timeout=90,
        interval=0.5,
        what="every run to complete after the restart",
    )
    assert worker.alive(), worker.log()
    assert all(row(run).result == [1, 2, 3, 4] for run in runs)
    assert row(late).status == S.COMPLETED
    # A step whose outcome could not be written during the outage runs again
    # (at-least-once); each is recorded exactly once.
    assert len(runs_of(log, "end")) == 13
    assert all(row(run).steps.count() == 4 for run in runs)

    # The worker saw the outage: both its connections were lost and came back,
    # and its metrics counted each comeback it logged.
    wait_for(lambda: "LISTEN connection back" in worker.log(), what="the LISTEN connection to come back")
    output = worker.log()
    assert output.index("cannot claim") < output.index("database back after"), output
    assert output.index("LISTEN connection lost") < output.index("LISTEN connection back after"), output
    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
    counted = re.search(r'^everystep_worker_database_reconnects_total\{runner="survivor"} (\S+)$', body, re.M)
    assert counted and float(counted[1]) == output.count(" back after "), body
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()
    assert postmaster_start_time("default") == given_server_started  # never restarted


def postmaster_start_time(alias: str):
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_postmaster_start_time()")
        return cursor.fetchone()[0]


@pytest.mark.parametrize(
    "drain, second_signal",
    [("1", False), ("60", True)],
    ids=["the-drain-deadline", "a-second-sigterm"],
)
def test_a_shutdown_that_cannot_reach_the_database_stops_at(spawn_worker, drain, second_signal):
    """The requeue at shutdown retries through an outage only until the drain's
    deadline, or until a second SIGTERM ("a second signal stops waiting"); the
    heartbeat left behind goes stale and another worker recovers the runs."""
    unreachable = f"postgres://postgres@127.0.0.1:{free_port()}/everystep"  # nothing listens there
    worker = spawn_worker("lonely", "--poll", "0.1", "--drain", drain, database_url=unreachable)
    wait_for(lambda: "cannot claim" in worker.log(), what="the worker to find the database down")

    worker.signal(signal.SIGTERM)  # nothing in flight: nothing to drain
    wait_for(lambda: "reconnecting" in worker.log(), what="the shutdown's requeue to retry")
    if second_signal:
        worker.signal(signal.SIGTERM)
    try:
        code = worker.wait(10)
    except subprocess.TimeoutExpired:
        pytest.fail("the worker was still shutting down after 10 s:\n" + worker.log()[-1500:])
    assert code == 0
