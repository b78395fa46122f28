"""The Worker class run in-process on a thread (an embedded worker)."""

import enum
import logging
import sys
import time

import pytest
from django.db import OperationalError, connection, transaction

from everystep import claims, heartbeats, operations, runner, step, workflow
from everystep import worker as worker_module
from everystep.api import schedule
from everystep.errors import EverystepError
from everystep.models import Step, Workflow
from everystep.worker import Worker
from tests.worker import workflows as w
from tests.worker.support import stop_and_join, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

S = Workflow.Status
CHAIN = "tests.worker.workflows.chain"
MARK = "tests.worker.workflows.mark"


def status_of(run) -> str:
    return Workflow.objects.values_list("status", flat=True).get(id=run.id)


@pytest.fixture(autouse=True)
def _open_the_gate(tmp_path):
    """A test that failed while a step waits at its gate lets it go, so the step's
    thread does not hold up the test run (torn down after the workers are stopped)."""
    yield
    (tmp_path / "gate").touch()


def left(worker) -> bool:
    """Every run in flight on ``worker`` was told (control NOTIFY) that it left it."""
    slots = list(worker._inflight.values())
    return bool(slots) and all(slot.left for slot in slots)


def count_calls(monkeypatch, owner, name: str):
    """Count calls of ``owner.name``; returns a function giving the count so far."""
    real = getattr(owner, name)
    calls = []

    def counted(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        finally:
            calls.append(None)

    monkeypatch.setattr(owner, name, counted)
    return lambda: len(calls)


def events(log, event=None, index=None) -> list:
    return [
        line
        for line in w.read_log(log)
        if (event is None or line[0] == event) and (index is None or line[2] == str(index))
    ]


def test_runs_scheduled_work_to_completion_and_returns_when_idle(tmp_path):
    log = str(tmp_path / "log")
    runs = [schedule(w.chain, log, 2) for _ in range(5)]
    Worker(pool_size=3, poll=0.05, name="w1", stop_when_idle=True).run()
    for run in runs:
        row = Workflow.objects.get(id=run.id)
        assert (row.status, row.result, row.claimed_by) == (S.COMPLETED, [1, 2], "w1")
    assert len(events(log, "end")) == 10


def test_never_holds_more_than_the_pool(start_worker):
    for _ in range(8):
        schedule(w.busy, 0.1)
    Worker(pool_size=3, poll=0.05, name="w1", stop_when_idle=True).run()
    assert Workflow.objects.filter(status=S.COMPLETED).count() == 8
    assert w.occupancy["max"] == 3


def test_a_full_worker_claims_nothing(tmp_path, start_worker, monkeypatch):
    """Runs beyond the pool stay scheduled, for other workers to take."""
    log, gate = str(tmp_path / "log"), tmp_path / "gate"
    runs = [schedule(w.held, log, str(gate)) for _ in range(5)]
    rounds = count_calls(monkeypatch, worker_module._Waker, "wait")  # one per round of the claim loop
    worker = start_worker(name="w1", pool_size=2)
    wait_for(lambda: len(events(log, "start", 1)) == 2, what="two runs to fill the pool")
    seen = rounds()
    wait_for(lambda: rounds() >= seen + 2, what="the claim loop to go round while full")
    claimed = Workflow.objects.filter(status=S.RUNNING, claimed_by="w1").count()
    assert (claimed, Workflow.objects.filter(status=S.SCHEDULED).count()) == (2, 3)
    gate.touch()
    wait_for(lambda: all(status_of(run) == S.COMPLETED for run in runs), what="every run to complete")
    stop_and_join(worker)


def test_an_idle_worker_with_recovery_off_claims_once_per_poll(start_worker, monkeypatch):
    """With EVERYSTEP_RECOVER_STALE_AFTER = None no look at the other workers
    follows a heartbeat: the loop must not wait for one, or it waits 0 s (a
    claim query per turn, a CPU core pinned)."""
    claim_calls = count_calls(monkeypatch, claims, "claim_runs")
    worker = start_worker(name="w1", pool_size=1, poll=0.1, listen=False, recover_stale_after=None)
    wait_for(claim_calls, what="the first claim")
    began, seen = time.monotonic(), claim_calls()
    wait_for(lambda: claim_calls() >= seen + 4, interval=0.01, what="four more claims")
    # About 0.3 s at one claim per poll; a busy loop claims thousands of times a second.
    assert time.monotonic() - began >= 0.1
    stop_and_join(worker)


def idle_worker(**options) -> Worker:
    """A worker between turns of its loop, whose heartbeat needs no database."""
    worker = Worker(name="w1", install_signals=False, listen=False, **options)
    worker._beat = lambda: None
    return worker


def test_tend_waits_for_no_look_at_the_others_while_recovery_is_off():
    worker = idle_worker(recover_stale_after=None)
    worker._tend(recover=True)  # a heartbeat
    assert worker._tend(recover=True) > 0


def test_tend_waits_for_no_look_at_the_others_while_draining():
    worker = idle_worker(recover_stale_after=60)
    worker._tend(recover=False)  # a heartbeat of the drain
    assert worker._tend(recover=False) > 0


def test_tend_waits_for_no_look_at_the_others_before_judging_them_again():
    """Back from an outage, the worker judges no one for a limit (the others
    lost the database too): its loop sleeps meanwhile, it does not spin."""
    from django.db import OperationalError

    worker = idle_worker(recover_stale_after=60)

    def lost():
        raise OperationalError("the database went away")

    worker._beat = lost
    worker._tend(recover=True)  # the heartbeat fails
    worker._beat = lambda: None
    worker._next_beat = 0.0
    worker._tend(recover=True)  # the database is back: no look for 60 s
    assert 0 < worker._tend(recover=True) <= worker.heartbeat_interval

def test_resumes_its_own_parked_runs_first(tmp_path):
    log = str(tmp_path / "log")
    mine = schedule(w.chain, log, 2)
    Workflow.objects.filter(id=mine.id).update(status=S.RUNNING, claimed_by="w1")
    Step.objects.create(
        workflow_id=mine.id, step_id="1", name="tests.worker.workflows.mark", status="done", result=1
    )
    theirs = schedule(w.chain, log, 1)
    Workflow.objects.filter(id=theirs.id).update(status=S.RUNNING, claimed_by="w2")

    Worker(pool_size=2, poll=0.05, name="w1", stop_when_idle=True).run()

    assert Workflow.objects.get(id=mine.id).result == [1, 2]
    assert [line[2] for line in events(log, "start")] == ["2"]  # step 1 was served from the store
    assert status_of(theirs) == S.RUNNING  # another worker's run is not touched


def test_an_unknown_workflow_fails_the_run_and_the_worker_goes_on(tmp_path):
    unknown = Workflow.objects.create(name="tests.worker.workflows.renamed_away", args=[])
    known = schedule(w.chain, str(tmp_path / "log"), 1)
    Worker(pool_size=1, poll=0.05, name="w1", stop_when_idle=True).run()
    row = Workflow.objects.get(id=unknown.id)
    assert row.status == S.FAILED
    assert "no @workflow is registered as 'tests.worker.workflows.renamed_away'" in row.error["message"]
    assert status_of(known) == S.COMPLETED


class Level(enum.Enum):
    HIGH = "high"


@workflow
def takes_a_level(level):
    return level.name


def test_a_run_whose_arguments_no_longer_decode_fails_alone_and_the_worker_goes_on(
    tmp_path, monkeypatch, scratch_modules
):
    parked = schedule(takes_a_level, Level.HIGH)  # left running under w1 by a crash: claimed again first
    Workflow.objects.filter(id=parked.id).update(status=S.RUNNING, claimed_by="w1")
    stale = schedule(takes_a_level, Level.HIGH)  # claimed next, with parked's end on PostgreSQL

    def limited_level(level):  # claimed through its limit's own query (everystep.limits)
        return level.name

    limited_level.__module__ = f"{scratch_modules.prefix}.flows"  # registered for this test only
    limited = schedule(workflow(max_concurrent=2)(limited_level), Level.HIGH)
    healthy = schedule(w.chain, str(tmp_path / "log"), 1)
    # A deploy renamed the enum's value: the stored arguments name one that is gone.
    monkeypatch.setattr(sys.modules[__name__], "Level", enum.Enum("Level", {"HIGH": "urgent"}))
    Worker(pool_size=1, poll=0.05, name="w1", stop_when_idle=True).run()
    for run in (parked, stale, limited):
        status, error = Workflow.objects.values_list("status", "error").get(id=run.id)
        assert status == S.FAILED
        assert f"run {run.id}: its stored arguments cannot be read" in error["message"]
        assert "'high' is not a valid Level" in error["message"]
    assert status_of(healthy) == S.COMPLETED


def test_a_run_deleted_meanwhile_is_logged_and_skipped(tmp_path, caplog):
    gone = schedule(w.self_deleting)
    known = schedule(w.chain, str(tmp_path / "log"), 1)
    with caplog.at_level(logging.WARNING, logger="everystep"):
        Worker(pool_size=1, poll=0.05, name="w1", stop_when_idle=True).run()
    assert not Workflow.objects.filter(id=gone.id).exists()
    assert f"run {gone.id} was deleted while worker 'w1' ran it" in caplog.text
    assert status_of(known) == S.COMPLETED


def test_an_engine_error_outside_the_body_fails_the_run_and_the_worker_survives(
    tmp_path, monkeypatch, caplog
):
    broken = schedule(w.chain, str(tmp_path / "log"), 1)
    healthy = schedule(w.chain, str(tmp_path / "log"), 1)
    real_execute = runner.execute

    def execute(run, claimer, **kwargs):
        if run.id == broken.id:
            raise RuntimeError("engine bug")
        return real_execute(run, claimer, **kwargs)

    monkeypatch.setattr(runner, "execute", execute)
    with caplog.at_level(logging.ERROR, logger="everystep"):
        Worker(pool_size=1, poll=0.05, name="w1", stop_when_idle=True).run()
    row = Workflow.objects.get(id=broken.id)
    assert row.status == S.FAILED and row.error["message"] == "engine bug"
    assert f"run {broken.id}: engine error outside the workflow body" in caplog.text
    assert status_of(healthy) == S.COMPLETED


@step
def interrupts():
    raise KeyboardInterrupt  # the runner lets it through, unrecorded


@workflow
def interrupted():
    return interrupts()


def test_a_keyboard_interrupt_from_a_step_fails_the_run_and_is_logged(tmp_path, caplog):
    run = schedule(interrupted)
    healthy = schedule(w.chain, str(tmp_path / "log"), 1)
    with caplog.at_level(logging.ERROR, logger="everystep"):
        Worker(pool_size=1, poll=0.05, name="w1", stop_when_idle=True).run()
    row = Workflow.objects.get(id=run.id)
    assert (row.status, row.error["type"]) == (S.FAILED, "builtins.KeyboardInterrupt")
    assert f"run {run.id}: engine error outside the workflow body" in caplog.text
    assert status_of(healthy) == S.COMPLETED


def test_stop_drains_at_the_next_step_boundary(tmp_path, start_worker, caplog):
    log = str(tmp_path / "log")
    run = schedule(w.chain, log, 3, 0.3)
    worker = start_worker(name="w1")
    wait_for(lambda: events(log, "start", 1), what="step 1 to start")
    with caplog.at_level(logging.WARNING, logger="everystep"):
        stop_and_join(worker)
    # The run requeued itself at the boundary: the shutdown's sweep found nothing left.
    assert "still claimed at shutdown" not in caplog.text
    assert worker.abandoned == 0
    row = Workflow.objects.get(id=run.id)
    assert (row.status, row.claimed_by) == (S.SCHEDULED, None)  # requeued for any worker
    assert list(row.steps.values_list("step_id", "status")) == [("1", "done")]  # the step in flight finished
    assert not events(log, "start", 2)


def test_a_drain_timeout_requeues_the_run_and_fences_the_step_in_flight(tmp_path, start_worker, caplog):
    log, gate = str(tmp_path / "log"), str(tmp_path / "gate")
    run = schedule(w.held, log, gate)
    worker = start_worker(name="w1", drain=0.3)
    wait_for(lambda: events(log, "start", 1), what="step 1 to start")
    started = time.monotonic()
    stop_and_join(worker)
    assert time.monotonic() - started < 10
    assert worker.abandoned == 1
    row = Workflow.objects.get(id=run.id)
    assert (row.status, row.claimed_by) == (S.SCHEDULED, None)
    with caplog.at_level(logging.WARNING, logger="everystep"):
        (tmp_path / "gate").touch()  # the abandoned step finishes now...
        # ...and its execution ends once the write of its outcome was attempted
        wait_for(lambda: not worker._inflight, what="the abandoned run's execution to end")
    assert f"run {run.id} is no longer running under 'w1'; step 1 was not recorded" in caplog.text
    assert not Step.objects.filter(workflow_id=run.id).exists()  # ...and wrote nothing
    assert status_of(run) == S.SCHEDULED


def test_a_draining_worker_sleeps_between_its_heartbeats(tmp_path, start_worker, monkeypatch):
    """The drain keeps the heartbeat up (the others must not take its runs) but
    looks at no other worker: it sleeps until the next beat, it does not spin."""
    log, gate = str(tmp_path / "log"), tmp_path / "gate"
    schedule(w.held, log, str(gate))
    worker = start_worker(name="w1", pool_size=1, heartbeat_interval=0.1)
    wait_for(lambda: events(log, "start", 1), what="step 1 to start")
    beats = count_calls(monkeypatch, heartbeats, "beat")
    turns = count_calls(monkeypatch, worker_module._Waker, "wait")
    worker.stop()
    wait_for(lambda: beats() >= 3, what="three heartbeats during the drain")
    gate.touch()
    stop_and_join(worker)
    # A turn per heartbeat, give or take the stop and the run's end; a drain
    # that spins goes round thousands of times between two beats.
    assert turns() <= 2 * beats() + 4, f"{turns()} turns of the drain loop for {beats()} heartbeats"

def test_an_operator_stop_is_observed_at_the_next_step_boundary(tmp_path, start_worker):
    """On PostgreSQL the NOTIFY keeps step 2 from starting at all; elsewhere step 2
    may run once more but its write is fenced out. Either way nothing is recorded
    after the stop and the run stays stopped."""
    log, gate = str(tmp_path / "log"), tmp_path / "gate"
    run = schedule(w.gapped, log, str(gate))
    worker = start_worker(name="w1")
    wait_for(lambda: Step.objects.filter(workflow_id=run.id).exists(), what="step 1 to be recorded")
    operations.stop_run(run.id, actor="alice", expected_status=S.RUNNING)
    if connection.vendor == "postgresql":
        wait_for(lambda: left(worker), timeout=10, what="the control NOTIFY")
    gate.touch()
    wait_for(lambda: not worker._inflight, what="the run to leave the worker")
    row = Workflow.objects.get(id=run.id)
    assert row.status == S.STOPPED and "alice" in row.error["message"]
    assert list(row.steps.values_list("step_id", flat=True)) == ["1"]
    if connection.vendor == "postgresql":
        assert not events(log, "start", 2)
    stop_and_join(worker)
    assert status_of(run) == S.STOPPED


def test_a_stale_worker_is_fenced_out_after_a_requeue(tmp_path, start_worker):
    log, gate = str(tmp_path / "log"), tmp_path / "gate"
    run = schedule(w.held, log, str(gate))
    stale = start_worker(name="stale", pool_size=1)
    wait_for(lambda: events(log, "start", 1), what="the stale worker's step 1")
    operations.requeue_run(run.id)  # as an operator would for a worker believed dead
    if connection.vendor == "postgresql":
        wait_for(lambda: left(stale), timeout=10, what="the control NOTIFY to reach the stale worker")
    fresh = start_worker(name="fresh", pool_size=1)
    wait_for(lambda: [line for line in events(log, "start", 1) if line[3] == "fresh"], what="fresh step 1")
    gate.touch()  # both executions of step 1 finish now
    wait_for(lambda: status_of(run) == S.COMPLETED, what="the run to complete")
    wait_for(lambda: not stale._inflight, what="the stale worker to let the run go")
    row = Workflow.objects.get(id=run.id)
    assert (row.claimed_by, row.result) == ("fresh", "fresh")  # step 1 recorded from the fresh worker
    assert list(row.steps.values_list("step_id", flat=True)) == ["1", "2"]
    assert [line[3] for line in events(log, "start", 2)] == ["fresh"]  # the stale one went no further
    stop_and_join(stale)
    stop_and_join(fresh)


def make_scheduled(how: str, log: str) -> Workflow:
    """A run made ``scheduled`` the way an application or an operator does it."""
    if how == "schedule":
        with transaction.atomic():
            return schedule(w.chain, log, 2)
    status = {"retry": S.FAILED, "requeue": S.RUNNING, "resolve": S.BLOCKED}[how]
    run = Workflow.objects.create(name=CHAIN, args=[log, 2], status=status, claimed_by="gone")
    if how == "retry":
        operations.retry_run(run.id)
    elif how == "requeue":
        operations.requeue_run(run.id)
    else:
        Step.objects.create(workflow=run, step_id="1", name=MARK, status="started")
        operations.resolve_step(run.id, "1", result=1)
    return run


@pytest.mark.parametrize("how", ["schedule", "retry", "requeue", "resolve"])
def test_a_notify_wakes_an_idle_worker(tmp_path, start_worker, monkeypatch, how):
    """The worker polls, beats and looks for stale workers every 10 minutes
    here: it runs the new run because the transition's NOTIFY woke it."""
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; other backends poll")
    log = str(tmp_path / "log")
    claim_calls = count_calls(monkeypatch, claims, "claim_runs")
    start_worker(name="w1", poll=600, heartbeat_interval=600, recover_stale_after=1800)
    # Two empty claims: one at start, and one when the listener, once LISTENing,
    # wakes the loop (for anything scheduled before). Then the loop sleeps.
    wait_for(lambda: claim_calls() >= 2, what="the worker to listen and go idle")
    run = make_scheduled(how, log)
    wait_for(lambda: status_of(run) == S.COMPLETED, timeout=10, what="the NOTIFY to wake the worker")
    assert Workflow.objects.get(id=run.id).result == [1, 2]


def test_embedded_worker_installs_no_signal_handlers_and_stops(start_worker, monkeypatch):
    import signal

    before = signal.getsignal(signal.SIGTERM)
    claim_calls = count_calls(monkeypatch, claims, "claim_runs")
    worker = start_worker(name="w1")
    wait_for(claim_calls, what="the claim loop to run")  # handlers would be installed before it
    assert signal.getsignal(signal.SIGTERM) is before
    stop_and_join(worker)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"pool_size": 0}, "pool size"),
        ({"poll": 0}, "poll interval"),
        ({"poll": float("nan")}, "poll interval must be a finite number"),
        ({"drain": -1}, "drain timeout"),
        ({"drain": float("nan")}, "drain timeout must be a finite number"),
        ({"name": "x" * 256}, "limit is 255"),
        ({"name": "w\x00"}, "worker name .* NUL character"),
        ({"heartbeat_interval": 0}, "EVERYSTEP_HEARTBEAT_INTERVAL must be a positive number"),
        ({"recover_stale_after": -1}, "EVERYSTEP_RECOVER_STALE_AFTER must be a positive number"),
        ({"recover_stale_after": "60"}, "EVERYSTEP_RECOVER_STALE_AFTER must be a positive number"),
        ({"heartbeat_interval": 5, "recover_stale_after": 10}, r"less than 3 heartbeat intervals"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(EverystepError, match=message):
        Worker(**options)


def test_default_name_is_the_hostname():
    import socket

    assert Worker().name == socket.gethostname()


def test_metrics_port_serves_the_workers_metrics(tmp_path, start_worker):
    pytest.importorskip("prometheus_client")
    import socket
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    schedule(w.chain, str(tmp_path / "log"), 1)
    worker = start_worker(name="metered", pool_size=3, metrics_port=port, metrics_bind="127.0.0.1")
    wait_for(lambda: not Workflow.objects.exclude(status=S.COMPLETED).exists(), what="the run to complete")
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'everystep_worker_pool_size{runner="metered"} 3.0' in body
    assert 'everystep_runs_claimed_total{runner="metered"} 1.0' in body
    stop_and_join(worker)


def test_runs_reclaimed_at_start_up_are_resumed_when_the_next_claim_fails_once(
    tmp_path, start_worker, monkeypatch
):
    """A restart resumes the runs left running under its name (docs/workers.md,
    "Crash recovery") also when the claim that follows the re-claim fails once
    (SQLite "database is locked", a MariaDB deadlock): dropped, they would stay
    running under a live worker, which no recovery takes them from."""
    log = str(tmp_path / "log")
    parked = schedule(w.chain, log, 1)  # left running by a previous life of "steady"
    Workflow.objects.filter(id=parked.id).update(status=S.RUNNING, claimed_by="steady")
    real_claim = claims.claim_runs
    failures = []

    def claim_failing_once(*args, **kwargs):
        if not failures:
            failures.append(None)
            raise OperationalError("database is locked")
        return real_claim(*args, **kwargs)

    monkeypatch.setattr(claims, "claim_runs", claim_failing_once)
    start_worker(name="steady", pool_size=2)

    wait_for(lambda: failures, what="the first claim to fail")
    # The claim loop retries (back-off: one --poll); the re-claimed run must not be forgotten.
    wait_for(
        lambda: Workflow.objects.get(id=parked.id).status == S.COMPLETED,
        timeout=10,
        what="the run left under the worker's name to be resumed",
    )
