"""Operator transitions racing a live worker: each race is made deterministic
with gates (files a step waits for), wrapped engine functions that land the
operator's write at the racy moment, and on PostgreSQL an advisory lock that
holds a statement after its snapshot."""

import os
import threading

import psycopg
import pytest
from django.db import connection  # noqa: F401  (read by the skipif condition below)

from everystep import claims, database, operations, step, workflow
from everystep import worker as worker_module
from everystep.api import schedule
from everystep.models import Step, Workflow
from everystep.scheduling import CONTROL_CHANNEL
from tests.worker import workflows as w
from tests.worker.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
postgresql_only = pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="PostgreSQL's LISTEN and snapshots"
)

S = Workflow.Status


def test_a_requeue_landing_during_the_start_up_reclaim_runs_the_run_once_at_a_time(
    tmp_path, start_worker, monkeypatch
):
    """A worker restarting under its name reclaims the runs parked under it
    (a plain read), then claims fresh ones: an operator's requeue committing
    between the two must not let the same claim take a reclaimed run again
    (two executions under one name both pass the fence)."""
    log, gate = str(tmp_path / "log"), tmp_path / "gate"
    try:
        run = schedule(w.held, log, str(gate))
        Workflow.objects.filter(id=run.id).update(status=S.RUNNING, claimed_by="w1")  # w1 crashed
        real_reclaim = claims.reclaim_own

        def reclaim_then_operator_requeues(claimer, limit):
            runs = real_reclaim(claimer, limit)
            if runs:
                operations.requeue_claimer("w1")  # everystep_requeue --claimer w1: w1 is gone, they think
            return runs

        monkeypatch.setattr(claims, "reclaim_own", reclaim_then_operator_requeues)
        real_claim, claim_calls = claims.claim_runs, []

        def counted_claim(*args, **kwargs):
            claim_calls.append(None)
            return real_claim(*args, **kwargs)

        monkeypatch.setattr(claims, "claim_runs", counted_claim)
        start_worker(name="w1", pool_size=2)
        wait_for(lambda: starts_of(log) >= 1, what="step 1 to start")
        turns = len(claim_calls)
        wait_for(lambda: len(claim_calls) >= turns + 2, what="two more claims by the worker")
        assert starts_of(log) == 1, "the run executes twice at once under one name"
        gate.touch()
        wait_for(lambda: Workflow.objects.get(id=run.id).status == S.COMPLETED, what="the run to complete")
        # Step 1 ran once, or (the requeue fenced the first record out) again after it, never beside it.
        step_1 = [line[0] for line in w.read_log(log) if line[2] == "1"]
        assert step_1 in (["start", "end"], ["start", "end", "start", "end"])
    finally:
        gate.touch()


def starts_of(log) -> int:
    return sum(line[0] == "start" and line[2] == "1" for line in w.read_log(log))


@postgresql_only
def test_a_stop_heard_between_the_claim_and_the_slot_is_not_lost(tmp_path, start_worker, monkeypatch):
    """The listener hears a stop for a run claimed here before its slot is seated."""
    log = str(tmp_path / "log")
    heard = threading.Event()
    real_notice = worker_module.Worker._on_notice

    def on_notice(self, channel, payload):
        real_notice(self, channel, payload)
        if channel == CONTROL_CHANNEL:
            heard.set()

    monkeypatch.setattr(worker_module.Worker, "_on_notice", on_notice)
    listening = threading.Event()
    real_hears = worker_module.Worker._hears_probe

    def hears(self, conn, params):
        ok = real_hears(self, conn, params)
        listening.set()
        return ok

    monkeypatch.setattr(worker_module.Worker, "_hears_probe", hears)
    real_claim = claims.claim_runs

    def claim_then_operator_stops(claimer, limit, *, exclude=()):
        runs = real_claim(claimer, limit, exclude=exclude)
        for run in runs:
            operations.stop_run(run.id, actor="alice", expected_status=S.RUNNING)
            assert heard.wait(10), "the listener never heard the stop"
        return runs

    monkeypatch.setattr(claims, "claim_runs", claim_then_operator_stops)
    worker = start_worker(name="w1", pool_size=1)
    assert listening.wait(10), "the worker's LISTEN connection did not come up"
    run = schedule(w.chain, log, 2)
    wait_for(lambda: heard.is_set(), what="the stop to be heard")
    wait_for(lambda: not worker._inflight, what="the run to leave the worker")
    assert Workflow.objects.get(id=run.id).status == S.STOPPED
    started = [line for line in w.read_log(log) if line[0] == "start"]
    assert started == [], f"the stopped run's step started after the worker heard the stop: {started}"


def test_a_control_notice_heard_long_before_a_claim_does_not_end_it(monkeypatch):
    """A stop heard for a run with no slot here is kept a few seconds for the
    claim it may race; a later claim of that run (requeued and claimed again
    minutes on) is not ended by it."""
    clock = [1000.0]
    monkeypatch.setattr(worker_module.time, "monotonic", lambda: clock[0])
    worker = worker_module.Worker(name="w1", install_signals=False, listen=False)
    run = schedule(w.chain, "unused", 1)
    worker._on_notice(CONTROL_CHANNEL, str(run.id))  # the run was not claimed here then
    clock[0] += worker_module.EARLY_NOTICE_KEPT + 60
    late = worker_module._Slot(worker, run)
    worker._seat(late)
    assert not late.left, "a claim minutes after a stale notice was ended by it"

    worker._inflight.pop(run.id)  # that claim ended; the run is claimed here once more
    worker._on_notice(CONTROL_CHANNEL, str(run.id))
    clock[0] += 0.5
    raced = worker_module._Slot(worker, run)
    worker._seat(raced)
    assert raced.left, "a notice heard just before the slot was seated was lost"


LOCK_KEY = 724242


@step
def per_claimer_gate(log: str, gates: str):
    """Step 1: waits for the gate file named after the worker running it."""
    run_id, claimer = w._where()
    w.log_line(log, "start", run_id, 1, claimer, os.getpid())
    w._wait_for_file(os.path.join(gates, claimer))
    w.log_line(log, "end", run_id, 1, claimer, os.getpid())
    return claimer


@workflow
def raced(log: str, gates: str):
    who = per_claimer_gate(log, gates)
    w.mark(log, 2)
    return who


HOLD = f"""
CREATE SEQUENCE race_hold_seq;
CREATE FUNCTION race_hold_hold() RETURNS trigger AS $$
BEGIN
  IF NEW.step_id = '1' AND nextval('race_hold_seq') = 1 THEN
    PERFORM pg_advisory_lock({LOCK_KEY});
    PERFORM pg_advisory_unlock({LOCK_KEY});
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER race_hold_hold BEFORE INSERT ON everystep_step
  FOR EACH ROW EXECUTE FUNCTION race_hold_hold();
"""
UNHOLD = """
DROP TRIGGER IF EXISTS race_hold_hold ON everystep_step;
DROP FUNCTION IF EXISTS race_hold_hold();
DROP SEQUENCE IF EXISTS race_hold_seq;
"""


@pytest.fixture
def holder():
    """A connection of the test's own to everystep's database (not default's in
    the split layout) holding the advisory lock; the trigger installed."""
    conn = psycopg.connect(**database.connection().get_connection_params(), autocommit=True)
    try:
        conn.execute(HOLD)
        conn.execute("SELECT pg_advisory_lock(%s)", [LOCK_KEY])
        yield conn
    finally:
        conn.execute("SELECT pg_advisory_unlock_all()")
        conn.execute(UNHOLD)
        conn.close()


def blocked_on_lock(conn) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = %s",
        [LOCK_KEY],
    ).fetchone()
    return row[0] > 0


def claimer_started(log, claimer) -> bool:
    return any(line[0] == "start" and line[3] == claimer for line in w.read_log(log))


@postgresql_only
def test_a_stale_insert_landing_after_a_requeue_does_not_strand_the_run(tmp_path, start_worker, holder):
    """w1's fenced step insert took its snapshot before an operator's requeue
    (PostgreSQL takes no lock on the run row for it) and commits after w2 loaded
    the run's rows: w2's own insert of that step then conflicts. The run must
    not stay running under w2, which no longer executes it: nothing would end it.
    A BEFORE INSERT trigger holds w1's insert on an advisory lock the test holds."""
    log, gates = str(tmp_path / "log"), tmp_path / "gates"
    gates.mkdir()
    try:
        run = schedule(raced, log, str(gates))
        w1 = start_worker(name="w1", pool_size=1)
        wait_for(lambda: claimer_started(log, "w1"), what="w1's step 1")
        (gates / "w1").touch()  # w1's step 1 returns; its insert is held after its snapshot
        wait_for(lambda: blocked_on_lock(holder), what="w1's step insert to be under way")

        operations.requeue_run(run.id)  # an operator believes w1 gone
        w2 = start_worker(name="w2", pool_size=1)
        wait_for(lambda: claimer_started(log, "w2"), what="w2's step 1 (its outcomes loaded)")

        holder.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])  # w1's insert commits now
        wait_for(lambda: Step.objects.filter(workflow_id=run.id, step_id="1").exists(),
                 what="w1's late step row")
        (gates / "w2").touch()  # w2's step 1 returns; its insert meets w1's row
        wait_for(lambda: not w2._inflight and not w1._inflight, what="both executions to end")

        row = Workflow.objects.get(id=run.id)
        assert (row.status, row.claimed_by) != (S.RUNNING, "w2"), (
            "the run is left running under w2, which no longer executes it: nothing will ever finish it"
        )
        wait_for(lambda: Workflow.objects.get(id=run.id).status == S.COMPLETED, timeout=20,
                 what="the run to complete")
    finally:
        for name in ("w1", "w2"):
            (gates / name).touch()
