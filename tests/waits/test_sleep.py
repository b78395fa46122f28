"""Durable sleep: the run leaves its worker as ``waiting``, keeps its wake
time across replays and crashes, and is claimable only once it is due."""

import datetime as dt
from unittest import mock

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from everystep import claims, operations, runner, sleep, step, waits, workflow
from everystep.api import schedule
from everystep.errors import EverystepError, SimulatedCrash
from everystep.models import Event, Step, Wait, Workflow
from tests.helpers import CLAIMER, run_once
from tests.waits import workflows as w

pytestmark = pytest.mark.django_db(transaction=True)

LATER = dt.timedelta(hours=1)


def sleeping_run(seconds=3600):
    run = run_once(schedule(w.naps, seconds))
    assert run.status == "waiting"
    return run


def test_a_sleep_leaves_the_worker_as_waiting_with_its_wake_time_recorded_once():
    before = timezone.now()
    run = sleeping_run(3600)
    assert run.claimed_by is None
    sleep_row = Step.objects.get(workflow=run, step_id="2")
    assert (sleep_row.name, sleep_row.status) == ("everystep.sleep", "started")
    wake_at = sleep_row.kwargs["wake_at"]
    assert before + dt.timedelta(seconds=3600) <= wake_at <= timezone.now() + dt.timedelta(seconds=3600)
    wait = Wait.objects.get(run=run)
    assert (wait.step_id, wait.kind, wait.wake_at) == ("2", "time", wake_at)
    assert w.effects == {"before": 1}


def test_a_waiting_run_is_not_claimable_before_its_wake_time():
    run = sleeping_run(3600)
    assert waits.wake_due() == (0, Wait.objects.get(run=run).wake_at)
    assert claims.claim_runs("another-worker", 10) == []
    assert Workflow.objects.get(id=run.id).status == "waiting"


def test_a_due_run_is_woken_once_and_resumes_after_the_sleep_without_sleeping_again():
    run = sleeping_run(3600)
    wake_at = Wait.objects.get(run=run).wake_at
    assert waits.wake_due(wake_at + dt.timedelta(seconds=1)) == (1, None)
    assert waits.wake_due(wake_at + dt.timedelta(seconds=1)) == (0, None)  # no second wake
    assert not Wait.objects.filter(run=run).exists()
    # The replaying worker's clock is past the wake time too.
    runner_now = wake_at + dt.timedelta(seconds=2)
    with mock.patch.object(timezone, "now", return_value=runner_now):
        run = run_once(Workflow.objects.get(id=run.id))
    assert (run.status, run.result) == ("completed", "after")
    assert w.effects == {"before": 1, "after": 1}
    sleep_row = Step.objects.get(workflow=run, step_id="2")
    assert (sleep_row.status, sleep_row.result, sleep_row.kwargs["wake_at"]) == ("done", None, wake_at)


def test_a_replay_before_the_wake_time_waits_again_for_the_same_time():
    run = sleeping_run(3600)
    wake_at = Wait.objects.get(run=run).wake_at
    Workflow.objects.filter(id=run.id).update(status="scheduled")  # e.g. an early, spurious wake
    Wait.objects.all().delete()
    run = run_once(Workflow.objects.get(id=run.id))
    assert run.status == "waiting"
    assert Wait.objects.get(run=run).wake_at == wake_at
    assert Step.objects.get(workflow=run, step_id="2").kwargs["wake_at"] == wake_at


@pytest.mark.parametrize("point", ["after the started row", "after the wake, before the done row"])
def test_a_crash_at_any_point_of_a_sleep_keeps_its_wake_time(point):
    run = schedule(w.naps, 0 if point != "after the started row" else 3600)
    passes = []

    def fault(ctx, step_id):
        if step_id == "2":
            passes.append(step_id)
            if len(passes) == 1:
                raise SimulatedCrash(point)

    runner.fault = fault
    crashed = run_once(run)
    assert (crashed.status, crashed.claimed_by) == ("running", CLAIMER)  # the process died
    wake_at = Step.objects.get(workflow=run, step_id="2").kwargs["wake_at"]
    runner.execute(crashed, CLAIMER)  # the worker restarts under its name
    again = Workflow.objects.get(id=run.id)
    assert Step.objects.get(workflow=run, step_id="2").kwargs["wake_at"] == wake_at
    if point == "after the started row":
        assert again.status == "waiting"
        assert Wait.objects.get(run=run).wake_at == wake_at
    else:
        assert (again.status, again.result) == ("completed", "after")
    assert w.effects["before"] == 1


def test_a_zero_sleep_is_recorded_and_returns_at_once():
    run = run_once(schedule(w.naps, 0))
    assert (run.status, run.result) == ("completed", "after")
    assert run.steps.get(step_id="2").status == "done"


def test_two_sleeps_with_ids_resume_in_turn():
    run = run_once(schedule(w.naps_twice, 0.001))
    for _ in range(3):
        if run.status != "waiting" and run.status != "scheduled":
            break
        waits.wake_due(timezone.now() + dt.timedelta(seconds=1))
        run = run_once(Workflow.objects.get(id=run.id))
    assert (run.status, run.result) == ("completed", "c")
    assert list(run.steps.values_list("step_id", "name", "status")) == [
        ("1", "tests.waits.workflows.note", "done"),
        ("2", "everystep.sleep", "done"),
        ("3", "tests.waits.workflows.note", "done"),
        ("second", "everystep.sleep", "done"),
        ("5", "tests.waits.workflows.note", "done"),
    ]
    assert w.effects == {"a": 1, "b": 1, "c": 1}


def test_sleep_until_a_past_time_returns_at_once():
    run = run_once(schedule(w.naps_until, (timezone.now() - LATER).isoformat()))
    assert (run.status, run.result) == ("completed", "after")
    assert run.steps.get(step_id="1").status == "done"


@override_settings(USE_TZ=False, TIME_ZONE="Asia/Kolkata")
def test_sleep_and_sleep_until_work_with_use_tz_false():
    """Wake times are then naive, in TIME_ZONE (as timezone.now() and Django's
    storage are): sleep_until's aware time is converted to it, not compared
    with a naive clock (a TypeError that failed the run)."""
    past = run_once(schedule(w.naps_until, "2020-01-01T00:00:00+00:00"))
    assert (past.status, past.result) == ("completed", "after")
    when = dt.datetime.now(dt.UTC) + LATER
    until = run_once(schedule(w.naps_until, when.isoformat()))
    slept = sleeping_run(3600)
    assert until.status == "waiting"
    wake_at = Wait.objects.get(run=until).wake_at
    assert wake_at == when.astimezone(timezone.get_default_timezone()).replace(tzinfo=None)
    assert timezone.is_naive(Wait.objects.get(run=slept).wake_at)
    assert waits.wake_due(wake_at - dt.timedelta(seconds=1))[0] == 0
    assert waits.wake_due(wake_at + dt.timedelta(seconds=1))[0] == 2
    with mock.patch.object(timezone, "now", return_value=wake_at + dt.timedelta(seconds=2)):
        results = [run_once(Workflow.objects.get(id=run.id)).result for run in (until, slept)]
    assert results == ["after", "after"]


def test_code_that_no_longer_sleeps_where_the_run_slept_is_a_divergence():
    run = sleeping_run(3600)
    swapped = "tests.waits.workflows.swaps_sleep_for_step"
    Workflow.objects.filter(id=run.id).update(status="scheduled", name=swapped)
    Step.objects.filter(workflow=run, step_id="1").delete()
    Step.objects.filter(workflow=run, step_id="2").update(step_id="1")
    run = run_once(Workflow.objects.get(id=run.id))
    assert run.status == "failed"
    assert run.error["type"] == "everystep.errors.WorkflowCodeError"
    assert "recorded as everystep.sleep" in run.error["message"]


def test_a_stopped_waiting_run_never_wakes():
    run = sleeping_run(3600)
    operations.stop_run(run.id, actor="alice")
    assert not Wait.objects.filter(run=run).exists()
    assert waits.wake_due(timezone.now() + LATER * 2) == (0, None)
    assert Workflow.objects.get(id=run.id).status == "stopped"


def test_prune_deletes_the_wait_and_event_rows_of_the_runs_it_deletes():
    run = sleeping_run(3600)
    waits.send_event(run.id, "k", 1)
    operations.stop_run(run.id)
    Wait.objects.create(run_id=run.id, step_id="x", kind="time", wake_at=timezone.now())
    assert operations.prune(older_than=dt.timedelta(0)) == 1
    assert not Wait.objects.exists() and not Event.objects.exists()


@pytest.mark.parametrize(
    "duration", [-1, "5", None, float("nan"), True, float("inf"), 10**400, 1e20, dt.timedelta.max]
)
def test_a_bad_duration_is_refused_with_its_value(duration):
    with pytest.raises(EverystepError, match="duration"):
        waits.sleep(duration)


@pytest.mark.parametrize("how", ["inf", "timeout=inf", "timedelta.max"])
def test_a_duration_no_wake_time_can_hold_fails_the_run_naming_it(how):
    """Infinite, or past the year 9999 (``timedelta.max``): refused with an
    EverystepError, not a bare OverflowError, and nothing is recorded for it."""
    run = run_once(schedule(w.waits_beyond_time, how))
    assert run.status == "failed"
    assert run.error["type"] == "everystep.errors.EverystepError"
    assert ("inf" if how != "timedelta.max" else "too large") in run.error["message"]
    assert not run.steps.exists() and not Wait.objects.exists()


def test_sleep_until_needs_an_aware_datetime():
    with pytest.raises(EverystepError, match="aware datetime"):
        waits.sleep_until(dt.datetime(2030, 1, 1))


def test_a_wait_row_that_outlived_its_runs_wait_never_wakes_the_run():
    # The wake is fenced on the run being waiting: a completed (or stopped, or
    # running) run with a stray due wait row stays as it is, and the row goes.
    done = run_once(schedule(w.naps, 0))
    Wait.objects.create(run_id=done.id, step_id="2", kind="time", wake_at=timezone.now())
    assert waits.wake_due(timezone.now() + dt.timedelta(seconds=1)) == (0, None)
    assert Workflow.objects.get(id=done.id).status == "completed"
    assert not Wait.objects.exists()


def test_only_the_due_runs_are_woken_and_the_next_wake_time_is_reported():
    soon, later = sleeping_run(60), sleeping_run(3600)
    soon_at = Wait.objects.get(run=soon).wake_at
    later_at = Wait.objects.get(run=later).wake_at
    assert waits.wake_due(soon_at) == (1, later_at)
    statuses = dict(Workflow.objects.values_list("id", "status"))
    assert (statuses[soon.id], statuses[later.id]) == ("scheduled", "waiting")


def test_a_run_waiting_anew_for_a_later_time_is_not_woken_by_its_old_wake_time():
    run = sleeping_run(60)
    old = Wait.objects.get(run=run)
    # Between a waker's reads and its lock, the run woke and waits again, later:
    # the waker's reads (the earliest wake time, then the due runs) are stale.
    Wait.objects.filter(id=old.id).update(wake_at=old.wake_at + LATER)
    stale, real = iter([old.wake_at]), waits._next_wake_at
    with (
        mock.patch.object(waits, "_next_wake_at", side_effect=lambda: next(stale, None) or real()),
        mock.patch.object(waits, "_due_candidates", return_value=[run.id]),
    ):
        assert waits.wake_due(old.wake_at + dt.timedelta(seconds=1)) == (0, old.wake_at + LATER)
    assert Workflow.objects.get(id=run.id).status == "waiting"
    assert Wait.objects.get(run=run).wake_at == old.wake_at + LATER


def test_a_sleep_in_a_parallel_branch_makes_the_run_wait_and_the_fork_resumes_whole():
    run = run_once(schedule(w.naps_in_a_branch, 3600))
    assert run.status == "waiting"
    assert Wait.objects.get(run=run).step_id == "1.0.1"
    operations.wake_now(run.id)
    run = run_once(Workflow.objects.get(id=run.id))
    assert (run.status, list(run.result)) == ("completed", ["slept", "beside"])
    assert w.effects == {"slept": 1, "beside": 1}


def test_a_look_with_nothing_due_is_one_query(django_assert_num_queries):
    """Every worker looks for due runs each poll interval: with none due (the
    usual answer) that is one read, outside a transaction."""
    from everystep import database

    run = sleeping_run(3600)
    wake_at = Wait.objects.get(run=run).wake_at
    with django_assert_num_queries(1, connection=database.connection()):
        assert waits.wake_due(wake_at - dt.timedelta(seconds=1)) == (0, wake_at)
    Wait.objects.all().delete()
    with django_assert_num_queries(1, connection=database.connection()):
        assert waits.wake_due() == (0, None)


# docs/operations.md: prune frees a pruned run's idempotency key, so
# --older-than must exceed the longest a body relies on a key (nothing records
# that a body's schedule() found a run by its key).

sent = []


@step
def send_invoice(order):
    sent.append(order)  # the effect: an e-mail to the customer
    return "sent"


@workflow
def invoice(order):
    return send_invoice(order)


@workflow
def order_flow(order):
    # In the body, so with a key: "then a replay returns the same run".
    schedule(invoice, order, idempotency_key=f"invoice-{order}")
    sleep(dt.timedelta(days=45))  # e.g. a return window
    return "closed"


def test_a_prune_older_than_a_bodys_sleep_keeps_the_keyed_run_its_replay_finds():
    sent.clear()
    parent = run_once(schedule(order_flow, "A-1"))
    assert parent.status == "waiting"
    child = Workflow.objects.get(idempotency_key="invoice-A-1")
    child = run_once(child)
    assert child.status == "completed"
    assert sent == ["A-1"]
    # 40 days later: a prune of runs that ended over 30 days ago would free the key...
    Workflow.objects.filter(id=child.id).update(completed_at=child.completed_at - dt.timedelta(days=40))
    assert operations.prune(older_than=dt.timedelta(days=30), dry_run=True) == 1
    # ...so the nightly prune keeps more than the body's 45 days.
    call_command("everystep_prune", "--older-than", "60")

    # The parent's sleep ends (wake_now stands in for the 45 days) and it replays its body.
    operations.wake_now(parent.id)
    assert run_once(Workflow.objects.get(id=parent.id)).status == "completed"

    # The replay's schedule() found the same run, not a new invoice.
    again = list(Workflow.objects.filter(name=child.name).exclude(id=child.id))
    for run in again:  # a worker would claim it
        run_once(run)
    assert sent == ["A-1"], "the invoice was sent twice: the replay's schedule() found no run for its key"
    assert again == []
