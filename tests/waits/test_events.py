"""Events: wait_for_event / send_event. The value becomes the wait's recorded
outcome exactly once, an early event is kept, a timeout raises at the wait,
and a send is part of the caller's transaction."""

import contextlib
import datetime as dt
import threading
import time
from unittest import mock

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from everystep import database, runner, waits
from everystep.api import schedule
from everystep.context import current
from everystep.errors import EverystepError, SimulatedCrash, Suspended
from everystep.models import Event, Step, Wait, Workflow
from tests.helpers import CLAIMER, run_once
from tests.waits import workflows as w
from tests.worker.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_run(key="approved", timeout=None):
    run = run_once(schedule(w.awaits, key, timeout))
    assert run.status == "waiting"
    return run


def resume(run):
    return run_once(Workflow.objects.get(id=run.id))


def test_a_run_waiting_for_an_event_holds_a_wait_row_and_a_started_step():
    run = waiting_run()
    wait = Wait.objects.get(run=run)
    assert (wait.step_id, wait.kind, wait.key, wait.wake_at) == ("2", "event", "approved", None)
    row = Step.objects.get(workflow=run, step_id="2")
    assert (row.name, row.status, row.args) == ("everystep.wait_for_event", "started", ["approved"])
    assert waits.wake_due(timezone.now() + dt.timedelta(days=3650)) == (0, None)


def test_a_sent_event_wakes_the_run_and_becomes_the_waits_recorded_result():
    run = waiting_run()
    assert waits.send_event(run.id, "approved", {"by": "alice"}) is True
    assert Workflow.objects.get(id=run.id).status == "scheduled"
    assert not Wait.objects.filter(run=run).exists()
    run = resume(run)
    assert (run.status, run.result) == ("completed", {"by": "alice"})
    assert Step.objects.get(workflow=run, step_id="2").result == {"by": "alice"}
    assert w.effects == {"before": 1, "got:{'by': 'alice'}": 1}


def test_a_second_send_of_a_key_changes_nothing():
    run = waiting_run()
    assert waits.send_event(run.id, "approved", 1) is True
    assert waits.send_event(run.id, "approved", 2) is False
    assert resume(run).result == 1
    assert list(Event.objects.filter(run=run).values_list("value", flat=True)) == [1]


def test_an_event_sent_before_the_wait_is_kept_and_served():
    run = schedule(w.awaits, "early")
    assert waits.send_event(run.id, "early", "first") is True
    run = run_once(run)
    assert (run.status, run.result) == ("completed", "first")
    assert not Wait.objects.exists()


def test_an_event_of_another_key_does_not_wake_the_run():
    run = waiting_run("approved")
    waits.send_event(run.id, "rejected", True)
    assert Workflow.objects.get(id=run.id).status == "waiting"


@pytest.mark.parametrize("waited, other", [("k", "K"), ("approved", "approved "), ("resume", "résumé")])
def test_keys_differing_only_by_case_space_or_accent_are_two_events(waited, other):
    """Before migration 0017, on MySQL/MariaDB, the other key woke the run, its
    value was served to the wait, and the waited key's send was refused."""
    run = waiting_run(waited)
    assert waits.send_event(run.id, other, "other") is True
    assert Workflow.objects.get(id=run.id).status == "waiting"
    assert waits.send_event(run.id, waited, "waited") is True
    assert resume(run).result == "waited"
    assert sorted(Event.objects.filter(run=run).values_list("key", flat=True)) == sorted([waited, other])


def test_a_send_is_rolled_back_with_the_callers_transaction():
    run = waiting_run()
    with pytest.raises(RuntimeError), transaction.atomic(using=database.alias()):
        waits.send_event(run.id, "approved", 1)
        raise RuntimeError("the caller's transaction fails")
    assert not Event.objects.exists()
    assert Workflow.objects.get(id=run.id).status == "waiting"
    assert Wait.objects.filter(run=run).exists()


def test_a_send_inside_a_committed_transaction_wakes_the_run():
    run = waiting_run()
    with transaction.atomic(using=database.alias()):  # the transaction on everystep's database
        waits.send_event(run.id, "approved", 7)
    assert resume(run).result == 7


def test_a_timeout_raises_at_the_wait_and_the_body_can_catch_it():
    run = run_once(schedule(w.awaits_or_gives_up, "k", 60))
    assert run.status == "waiting"
    wake_at = Wait.objects.get(run=run).wake_at
    assert waits.wake_due(wake_at + dt.timedelta(seconds=1))[0] == 1
    with mock.patch.object(timezone, "now", return_value=wake_at + dt.timedelta(seconds=2)):
        run = resume(run)
    assert (run.status, run.result) == ("completed", "timed out")
    row = Step.objects.get(workflow=run, step_id="1")
    assert (row.status, row.error["type"]) == ("failed", "everystep.errors.WaitTimeout")
    # An event after the timeout is kept but changes nothing.
    waits.send_event(run.id, "k", "late")
    assert Workflow.objects.get(id=run.id).result == "timed out"


def test_an_uncaught_timeout_fails_the_run_with_wait_timeout():
    run = waiting_run("k", 60)
    wake_at = Wait.objects.get(run=run).wake_at
    waits.wake_due(wake_at)
    with mock.patch.object(timezone, "now", return_value=wake_at):
        run = resume(run)
    assert run.status == "failed"
    assert run.error["type"] == "everystep.errors.WaitTimeout"
    assert "no event 'k'" in run.error["message"]


def test_an_event_that_arrives_before_the_timeout_wins():
    run = waiting_run("k", 60)
    waits.send_event(run.id, "k", "in time")
    assert not Wait.objects.exists()
    assert resume(run).result == "in time"


def test_an_event_sent_after_the_timeout_passed_loses_to_it_however_late_the_replay():
    """The timeout passes, a worker wakes the run for it, and the event comes
    before a worker replays the run: the body still sees WaitTimeout, as it
    would had the replay come first (the answer must not hang on worker latency)."""
    run = run_once(schedule(w.awaits_or_gives_up, "approval", 60))
    assert run.status == "waiting"
    deadline = timezone.now() - dt.timedelta(seconds=30)  # the timeout has passed
    started = Step.objects.get(workflow=run, step_id="1")
    Step.objects.filter(pk=started.pk).update(kwargs={**started.kwargs, "wake_at": deadline})
    Wait.objects.filter(run=run).update(wake_at=deadline)
    assert waits.wake_due()[0] == 1
    assert waits.send_event(run.id, "approval", "too late") is True
    run = run_once(Workflow.objects.get(id=run.id))
    assert (run.status, run.result) == ("completed", "timed out")


@pytest.mark.parametrize("point", [1, 2])
def test_a_crash_at_a_wait_serves_the_event_exactly_once(point):
    # 1: after the started row (before the suspension); 2: after the event
    # was found, before the done row.
    run = waiting_run() if point == 2 else schedule(w.awaits, "approved")
    if point == 2:
        waits.send_event(run.id, "approved", "v")
    passes = []

    def fault(ctx, step_id):
        if step_id == "2":
            passes.append(step_id)
            if len(passes) == 1:  # the first fault call of this pass
                raise SimulatedCrash(f"crash at point {point}")

    runner.fault = fault
    crashed = run_once(Workflow.objects.get(id=run.id))
    assert (crashed.status, crashed.claimed_by) == ("running", CLAIMER)
    runner.fault = None
    runner.execute(crashed, CLAIMER)
    if point == 1:
        assert Workflow.objects.get(id=run.id).status == "waiting"
        waits.send_event(run.id, "approved", "v")
        resume(run)
    run = Workflow.objects.get(id=run.id)
    assert (run.status, run.result) == ("completed", "v")
    assert w.effects == {"before": 1, "got:v": 1}


def test_a_crash_inside_the_suspension_leaves_the_run_to_its_worker():
    run = schedule(w.awaits, "k")

    def die(*args, **kwargs):
        raise SimulatedCrash("the process died while suspending")

    with mock.patch.object(waits, "suspend_run", die), pytest.raises(SimulatedCrash):
        run_once(run)
    crashed = Workflow.objects.get(id=run.id)
    assert (crashed.status, crashed.claimed_by) == ("running", CLAIMER)
    assert not Wait.objects.exists()
    runner.execute(crashed, CLAIMER)
    assert Workflow.objects.get(id=run.id).status == "waiting"
    assert Wait.objects.filter(run=run).count() == 1


def test_an_event_sent_while_the_run_suspends_is_not_lost():
    # The send commits after the wait found no event and before the suspension:
    # the suspending transaction sees it and schedules the run.
    run = schedule(w.awaits, "k")
    real = waits.suspend_run

    def send_then_suspend(run_id, claimer, waiting):
        waits.send_event(run_id, "k", "raced")
        return real(run_id, claimer, waiting)

    with mock.patch.object(waits, "suspend_run", send_then_suspend):
        assert run_once(run).status == "scheduled"
    assert not Wait.objects.exists()
    assert resume(run).result == "raced"


def test_sends_racing_suspensions_on_real_threads_lose_no_wake_up(start_worker):
    # Each event is sent by another thread the moment its run records the wait,
    # racing the worker's suspension; every run must still complete.
    runs = [schedule(w.awaits, "go") for _ in range(12)]
    sent = set()
    stop = threading.Event()

    def sender():
        while not stop.is_set() and len(sent) < len(runs):
            started = Step.objects.filter(
                workflow_id__in=[r.id for r in runs], name=waits.WAIT_FOR_EVENT
            ).values_list("workflow_id", flat=True)
            for run_id in set(started) - sent:
                waits.send_event(run_id, "go", str(run_id))
                sent.add(run_id)
        connections.close_all()  # this thread's connections, to both databases when split

    thread = threading.Thread(target=sender)
    thread.start()
    try:
        start_worker(pool_size=4, poll=0.05)
        wait_for(
            lambda: Workflow.objects.filter(id__in=[r.id for r in runs], status="completed").count() == 12,
            what="every run to get its event",
        )
    finally:
        stop.set()
        thread.join(30)
    for run in runs:
        assert Workflow.objects.get(id=run.id).result == str(run.id)


def test_on_postgresql_a_send_wakes_an_idle_worker_by_notify(start_worker):
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")
    worker = start_worker(pool_size=1, poll=600, heartbeat_interval=600, recover_stale_after=1800)
    run = schedule(w.awaits, "k")
    wait_for(lambda: Workflow.objects.get(id=run.id).status == "waiting", what="the run to wait")
    # No timer, no poll, no heartbeat: only the NOTIFY can wake the loop.
    worker._next_wake = float("inf")
    waits.send_event(run.id, "k", "notified")
    wait_for(
        lambda: Workflow.objects.get(id=run.id).status == "completed", what="the NOTIFY to wake the worker"
    )


def test_bad_sends_are_refused_naming_the_problem():
    run = waiting_run()
    with pytest.raises(EverystepError, match="non-empty string"):
        waits.send_event(run.id, "", 1)
    with pytest.raises(EverystepError, match="characters; the limit is 255"):
        waits.send_event(run.id, "k" * 256, 1)
    with pytest.raises(EverystepError, match="NUL character"):  # not a DataError on PostgreSQL
        waits.send_event(run.id, "k\x00", 1)
    with pytest.raises(EverystepError, match="not serializable"):
        waits.send_event(run.id, "approved", object())
    with pytest.raises(EverystepError, match="more than 4300 digits"):  # not a ValueError from json
        waits.send_event(run.id, "approved", 10**5000)
    with pytest.raises(EverystepError, match="does not exist"):
        waits.send_event("01900000-0000-7000-8000-000000000000", "approved", 1)
    with pytest.raises(EverystepError, match="not a valid run id"):
        waits.send_event("nope", "approved", 1)
    assert not Event.objects.exists()


def test_wait_for_event_outside_a_run_is_refused():
    with pytest.raises(EverystepError, match="only in a workflow's body"):
        waits.wait_for_event("k")


def test_a_database_outage_at_a_wait_requeues_the_run_instead_of_failing_it():
    """The chaos soak's finding: a PostgreSQL restart while a replay reads its
    wait's record failed the run from the body. The read is guarded as the
    engine's writes are: the run goes back to the queue and a replay finishes it."""
    from django.db import OperationalError

    run = waiting_run()
    waits.send_event(run.id, "approved", "yes")
    outage = OperationalError("terminating connection due to administrator command")
    with mock.patch.object(waits, "_recorded_params", side_effect=outage):
        assert resume(run).status == "scheduled"
    run = resume(run)
    assert (run.status, run.result) == ("completed", "yes")
    assert w.effects == {"before": 1, "got:yes": 1}


# ---------------------------------------------------------------- waits in parallel branches


def both_branches_waiting(timeout=60, ask=False):
    """``approval_or_cancel``: both branches reach their wait before either
    halts the run, the "cancel" one (no wake time) first. The fault hook runs
    right after each wait's ``started`` row is written."""
    approval = "1.1.2" if ask else "1.1.1"
    barrier = threading.Barrier(2, timeout=10)

    def both_record_then_cancel_halts_first(ctx, step_id):
        if step_id in ("1.0.1", approval):
            barrier.wait()
            if step_id == approval:
                time.sleep(0.3)

    with mock.patch.object(runner, "fault", both_record_then_cancel_halts_first):
        run = run_once(schedule(w.approval_or_cancel, timeout, ask))
    assert run.status == "waiting"
    return run


def deadline_of(run, step_id="1.1.1"):
    return Step.objects.get(workflow=run, step_id=step_id).kwargs["wake_at"]


def wait_rows(run):
    return set(Wait.objects.filter(run_id=run.id).values_list("step_id", "key", "wake_at"))


@contextlib.contextmanager
def branch_waits_after(first, then, step=None):
    """The wait (or with ``step``, that step) of the branch with prefix ``then``
    is reached only once the branch ``first`` has reached its wait (``first``
    "halt": once the run is halted)."""
    reached = threading.Event()
    real_wait_step, real_note = waits.wait_step, w.note

    def hold(ctx):
        if first == "halt":
            wait_for(lambda: ctx.state.halt is not None, timeout=10, interval=0.01, what="the halt")
        else:
            assert reached.wait(10)

    def wait_step(*args, **kwargs):
        ctx = current()
        if ctx.prefix == first:
            reached.set()
        if ctx.prefix == then and step is None:
            hold(ctx)
        return real_wait_step(*args, **kwargs)

    def note(label):
        if label == step and current().prefix == then:
            hold(current())
        return real_note(label)

    with mock.patch.object(waits, "wait_step", wait_step), mock.patch.object(w, "note", note):
        yield


def test_each_waiting_branch_has_its_wait_row_and_a_branchs_timeout_wakes_the_run():
    """Not only the first branch's wait: the approval's timeout (recorded in its
    step) is a wait row too, so the run wakes when it passes, not when "cancel" comes."""
    run = both_branches_waiting(60)
    deadline = deadline_of(run)
    assert wait_rows(run) == {("1.0.1", "cancel", None), ("1.1.1", "approval", deadline)}
    assert waits.wake_due(deadline - dt.timedelta(seconds=1)) == (0, deadline)
    assert waits.wake_due(deadline + dt.timedelta(seconds=1)) == (1, None)
    with mock.patch.object(timezone, "now", return_value=deadline + dt.timedelta(seconds=2)):
        run = resume(run)
    assert run.status == "waiting"  # the approval timed out; "cancel" is still awaited
    assert wait_rows(run) == {("1.0.1", "cancel", None)}
    assert Step.objects.get(workflow=run, step_id="1.1.1").error["type"] == "everystep.errors.WaitTimeout"
    waits.send_event(run.id, "cancel", "c")
    run = resume(run)
    assert (run.status, list(run.result)) == ("completed", ["c", "timed out"])


@pytest.mark.parametrize("key", ["cancel", "approval"])
def test_an_event_for_either_waiting_branch_wakes_the_run(key):
    run = both_branches_waiting(60)
    deadline = deadline_of(run)
    assert waits.send_event(run.id, key, "v") is True
    assert Workflow.objects.get(id=run.id).status == "scheduled"
    run = resume(run)
    assert run.status == "waiting"  # for the other branch's wait, its wake time kept
    other = {"cancel": ("1.1.1", "approval", deadline), "approval": ("1.0.1", "cancel", None)}[key]
    assert wait_rows(run) == {other}


def test_a_sibling_halting_first_does_not_stop_a_branch_at_its_recorded_wait():
    """On the replay the "cancel" branch halts the run before the approval
    branch gets to its wait: that wait, reached on the first pass, is still
    looked at, and the approval sent meanwhile is its outcome on this pass."""
    run = both_branches_waiting(60)
    waits.send_event(run.id, "approval", "yes")
    with branch_waits_after("halt", then="1.1."):
        run = resume(run)
    assert run.status == "waiting"
    assert wait_rows(run) == {("1.0.1", "cancel", None)}
    assert Step.objects.get(workflow=run, step_id="1.1.1").status == "done"


def test_a_terminal_in_a_branch_stops_the_run_even_when_a_sibling_branch_waits():
    """ENGINE.md: a Terminal in any branch is raised as is and the run ends
    stopped. Here the sibling branch's wait halts the run while the refusing
    step is in flight: the Terminal still wins, and no wait row is written."""
    refused = threading.Event()

    def wait_halts_while_the_refusal_runs(ctx, step_id):
        if step_id == "1.0.1":  # the wait's started row is written; it halts the run next
            assert refused.wait(10)
        elif step_id == "1.1.1":  # the step raised Terminal; its row is written next
            refused.set()
            wait_for(lambda: isinstance(ctx.state.halt, Suspended), timeout=10, interval=0.01, what="a wait")

    with mock.patch.object(runner, "fault", wait_halts_while_the_refusal_runs):
        run = run_once(schedule(w.approval_or_refusal))
    assert (run.status, run.error["type"]) == ("stopped", "everystep.errors.Terminal")
    assert run.error["message"] == "order is invalid"
    assert not Wait.objects.filter(run=run).exists()


@pytest.mark.parametrize("woken_by", ["its timeout", "its event"])
def test_a_branch_halted_at_a_step_before_its_recorded_wait_keeps_its_wait_row(woken_by):
    """A sibling's wait halts the approval branch at its step ``asked`` (served),
    short of its ``started`` wait: that wait keeps its row (its recorded wake
    time, its key), and an event that came while the run ran schedules it again
    at once."""
    run = both_branches_waiting(60, ask=True)
    deadline = deadline_of(run, "1.1.2")
    clock = deadline + dt.timedelta(seconds=2)
    if woken_by == "its timeout":
        waits.wake_due(clock)
    else:
        waits.send_event(run.id, "approval", "yes")
    with (
        branch_waits_after("halt", then="1.1.", step="asked"),
        mock.patch.object(timezone, "now", return_value=clock),
    ):
        again = resume(run)
    assert Step.objects.get(workflow=run, step_id="1.1.2").status == "started"  # not reached
    if woken_by == "its timeout":
        assert again.status == "waiting"
        assert wait_rows(run) == {("1.0.1", "cancel", None), ("1.1.2", "approval", deadline)}
        assert waits.wake_due(clock)[0] == 1
    else:
        assert again.status == "scheduled"
    with branch_waits_after("1.1.", then="1.0."), mock.patch.object(timezone, "now", return_value=clock):
        run = resume(run)
    assert (run.status, wait_rows(run)) == ("waiting", {("1.0.1", "cancel", None)})
    approval = Step.objects.get(workflow=run, step_id="1.1.2")
    assert approval.status == ("failed" if woken_by == "its timeout" else "done")
    assert w.effects["asked"] == 1
