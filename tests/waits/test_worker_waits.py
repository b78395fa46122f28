"""Sleeping runs under real worker threads: they hold no worker slot, and a
due run is picked up by the worker's wake-up timer, not the next poll."""

import datetime as dt
import signal
import threading

import pytest
from django.utils import timezone

from everystep import sleep, step, waits, workflow
from everystep.api import schedule
from everystep.models import Wait, Workflow
from tests.waits import workflows as w
from tests.worker.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def statuses(runs) -> list[str]:
    found = dict(Workflow.objects.filter(id__in=[run.id for run in runs]).values_list("id", "status"))
    return [found[run.id] for run in runs]


def test_sleeping_runs_hold_no_worker_slot(start_worker):
    # One slot, five runs asleep for an hour: a sixth run still gets the slot.
    sleepers = [schedule(w.naps, 3600) for _ in range(5)]
    start_worker(pool_size=1)
    wait_for(lambda: statuses(sleepers) == ["waiting"] * 5, what="five sleeping runs")
    quick = schedule(w.wakes_late, 0)
    wait_for(lambda: statuses([quick]) == ["completed"], what="a run beside the sleepers")
    assert Wait.objects.count() == 5
    assert Workflow.objects.get(id=sleepers[0].id).claimed_by is None


def test_a_worker_wakes_a_due_run_by_its_timer_long_before_its_next_poll(start_worker):
    # poll=600: only the timer set from the wake time can wake the run in time.
    run = schedule(w.naps, 0.5)  # before the start: the first claim takes it
    start_worker(pool_size=2, poll=600, listen=False)
    wait_for(lambda: statuses([run]) == ["completed"], what="the sleeper to wake and finish")
    row = Workflow.objects.get(id=run.id)
    assert row.result == "after"
    wake_at = row.steps.get(step_id="2").kwargs["wake_at"]
    assert wake_at <= row.completed_at <= timezone.now()
    assert w.effects == {"before": 1, "after": 1}


def test_a_run_another_worker_put_to_sleep_is_woken_within_a_poll(start_worker):
    # The run suspends on worker a; worker b (polling every 0.1s) must wake it
    # even though a stops before the wake time.
    run = schedule(w.naps, 1)
    a = start_worker(name="a", pool_size=1, listen=False)
    wait_for(lambda: statuses([run]) == ["waiting"], what="the run to sleep on a")
    a.stop()
    a.thread.join(30)
    start_worker(name="b", pool_size=1, poll=0.1, listen=False)
    wait_for(lambda: statuses([run]) == ["completed"], what="b to wake the run")
    assert Workflow.objects.get(id=run.id).claimed_by == "b"


def test_a_backlog_of_due_runs_longer_than_one_look_is_all_woken_at_once(start_worker, monkeypatch):
    # A look wakes at most WAKE_BATCHES batches (the loop beats in between):
    # the rest must be woken by the next turns at once, not a poll (600 s) later.
    monkeypatch.setattr(waits, "WAKE_BATCH", 2)
    at = (timezone.now() + dt.timedelta(seconds=2)).isoformat()
    runs = [schedule(w.naps_until, at) for _ in range(5 * 2 * waits.WAKE_BATCHES)]
    start_worker(pool_size=4, poll=600, listen=False)
    wait_for(lambda: set(statuses(runs)) == {"completed"}, timeout=20, what="every sleeper to finish")


def test_a_sleep_outlives_the_worker_process_that_put_the_run_to_sleep(spawn_worker):
    # Worker a (a process) suspends the run and is killed: the run is waiting,
    # claimed by no one, and worker b wakes and finishes it at its wake time.
    run = schedule(w.naps, 3)
    a = spawn_worker("a", "--pool", "1", "--poll", "0.1")
    wait_for(lambda: statuses([run]) == ["waiting"], what="the run to sleep on a")
    a.signal(signal.SIGKILL)
    a.wait()
    row = Workflow.objects.get(id=run.id)
    assert (row.status, row.claimed_by) == ("waiting", None)
    b = spawn_worker("b", "--pool", "1", "--poll", "0.1")
    wait_for(lambda: statuses([run]) == ["completed"], what="b to wake and finish the run")
    row = Workflow.objects.get(id=run.id)
    assert (row.claimed_by, row.result) == ("b", "after")
    assert row.completed_at >= row.steps.get(step_id="2").kwargs["wake_at"]
    b.signal(signal.SIGTERM)
    assert b.wait() == 0


# A run that suspends while its slot goes straight on with the next queued run
# (docs/waits.md: "a run due in 3 s is claimed about 3 s from now, not at the
# next poll"): the loop must look again, not sleep on the wait it computed before.

gate = threading.Event()
hold = threading.Event()


@step
def pass_gate():
    assert gate.wait(30)
    return "passed"


@step
def hold_on():
    hold.wait(60)
    return "held"


@workflow
def gated_nap():
    pass_gate()
    sleep(1)
    return "after"


@workflow
def holder():
    return hold_on()


def test_a_run_that_suspends_before_its_slot_takes_the_next_run_is_woken_at_its_wake_time(start_worker):
    gate.clear()
    hold.clear()
    nap = schedule(gated_nap)
    try:
        # Two slots, one poll a minute (LISTEN off: SQLite/MySQL, or a pgbouncer).
        start_worker(pool_size=2, poll=60, listen=False, heartbeat_interval=120, recover_stale_after=None)
        wait_for(lambda: statuses([nap]) == ["running"], what="the nap run to be claimed")
        other = schedule(holder)  # queued: the nap's slot takes it when the nap suspends
        gate.set()
        wait_for(lambda: statuses([nap]) == ["waiting"], what="the nap run to sleep")
        wait_for(lambda: statuses([other]) == ["running"], what="its slot to take the next run")
        # One slot is free; the sleep is due in 1 s, the next poll in 60 s.
        wait_for(lambda: statuses([nap]) == ["completed"], timeout=10, what="the nap run to wake on time")
    finally:
        gate.set()
        hold.set()
