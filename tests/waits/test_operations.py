"""Operator transitions on waiting runs: wake_now, stop, requeue, retry,
resolve and the management commands."""

import datetime as dt
import uuid

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from everystep import operations, waits
from everystep.api import schedule
from everystep.errors import EverystepError
from everystep.models import Step, Wait, Workflow
from tests.helpers import run_once
from tests.waits import workflows as w

pytestmark = pytest.mark.django_db(transaction=True)


def resume(run):
    return run_once(Workflow.objects.get(id=run.id))


def test_wake_now_ends_a_sleep_at_once_and_the_sleep_returns_none():
    run = run_once(schedule(w.naps, 3600))
    woken = operations.wake_now(run.id, actor="alice")
    assert (woken.status, woken.claimed_by) == ("scheduled", None)
    assert not Wait.objects.exists()
    assert Step.objects.get(workflow=run, step_id="2").status == "done"
    run = resume(run)
    assert (run.status, run.result) == ("completed", "after")


def test_wake_now_ends_an_event_wait_with_a_timeout_as_its_timeout_would():
    run = run_once(schedule(w.awaits_or_gives_up, "k", 3600))
    operations.wake_now(run.id, actor="alice")
    row = Step.objects.get(workflow=run, step_id="1")
    assert row.error["type"] == "everystep.errors.WaitTimeout"
    assert "woken by an operator (alice)" in row.error["message"]
    assert resume(run).result == "timed out"
    waits.send_event(run.id, "k", "too late")  # kept, but the wait is over
    assert Workflow.objects.get(id=run.id).result == "timed out"


def test_wake_now_refuses_an_event_wait_without_timeout_and_a_run_that_is_not_waiting():
    run = run_once(schedule(w.awaits, "k", None))
    with pytest.raises(EverystepError, match="without a timeout: send it the event"):
        operations.wake_now(run.id)
    assert Workflow.objects.get(id=run.id).status == "waiting"
    done = run_once(schedule(w.naps, 0))
    with pytest.raises(EverystepError, match="is completed: only a waiting run can be woken"):
        operations.wake_now(done.id)


def test_a_stopped_waiting_run_ignores_events_and_a_retry_waits_again_for_the_same_time():
    run = run_once(schedule(w.naps, 3600))
    wake_at = Wait.objects.get(run=run).wake_at
    operations.stop_run(run.id, expected_status="waiting")
    assert operations.retry_run(run.id) == []
    run = resume(run)
    assert run.status == "waiting"
    assert Wait.objects.get(run=run).wake_at == wake_at
    assert w.effects == {"before": 1}


def test_a_stopped_event_wait_is_not_woken_by_its_event_and_a_retry_gets_it():
    run = run_once(schedule(w.awaits, "k", None))
    operations.stop_run(run.id)
    assert waits.send_event(run.id, "k", 5) is True
    assert Workflow.objects.get(id=run.id).status == "stopped"
    operations.retry_run(run.id)
    assert resume(run).result == 5


def test_requeue_refuses_a_waiting_run_and_points_to_wake_now():
    run = run_once(schedule(w.naps, 3600))
    with pytest.raises(EverystepError, match="wake it with wake_now"):
        operations.requeue_run(run.id, expected_status=None)
    assert Workflow.objects.get(id=run.id).status == "waiting"


def test_resolve_never_offers_a_wait_as_an_uncertain_step():
    run = run_once(schedule(w.naps, 3600))
    Workflow.objects.filter(id=run.id).update(status="blocked")
    with pytest.raises(EverystepError, match=r"started steps: none"):
        operations.resolve_step(run.id, "2", discard=True)


def test_the_commands_wake_a_run_and_send_an_event(capsys):
    sleeper = run_once(schedule(w.naps, 3600))
    call_command("everystep_wake", str(sleeper.id))
    assert Workflow.objects.get(id=sleeper.id).status == "scheduled"
    waiter = run_once(schedule(w.awaits, "k", None))
    call_command("everystep_send_event", str(waiter.id), "k", "--value", '{"ok": true}')
    assert Workflow.objects.get(id=waiter.id).status == "scheduled"
    assert resume(waiter).result == {"ok": True}
    out = capsys.readouterr().out
    assert f"woke {sleeper.id}" in out and f"sent event 'k' to {waiter.id}" in out
    with pytest.raises(CommandError, match="not valid JSON"):
        call_command("everystep_send_event", str(waiter.id), "k", "--value", "{nope")
    with pytest.raises(CommandError, match="only a waiting run can be woken"):
        call_command("everystep_wake", str(waiter.id))


def test_a_run_id_given_twice_is_acted_on_once(capsys):
    # The second time it was refused (the run had just been woken): exit 1 after a success.
    sleeper = run_once(schedule(w.naps, 3600))
    call_command("everystep_wake", str(sleeper.id), str(sleeper.id).upper())
    assert Workflow.objects.get(id=sleeper.id).status == "scheduled"
    assert capsys.readouterr().out == f"woke {sleeper.id}\n"


def test_the_event_command_prints_the_refusal_of_a_missing_run():
    missing = uuid.uuid4()
    with pytest.raises(CommandError, match=f"run {missing} does not exist"):
        call_command("everystep_send_event", str(missing), "k")


def test_the_event_command_reads_the_value_as_the_ui_does():
    # Tagged values decoded; JSON nested too deeply refused (it was a RecursionError traceback).
    waiter = run_once(schedule(w.awaits, "k", None))
    with pytest.raises(CommandError, match="--value is not valid JSON: the JSON is nested too deeply"):
        call_command("everystep_send_event", str(waiter.id), "k", "--value", "[" * 5000 + "]" * 5000)
    assert Workflow.objects.get(id=waiter.id).status == "waiting"
    call_command("everystep_send_event", str(waiter.id), "k", "--value", '{"$es": "date", "v": "2024-05-01"}')
    assert resume(waiter).result == dt.date(2024, 5, 1)


def test_the_event_command_refuses_a_nul_in_the_key():
    waiter = run_once(schedule(w.awaits, "k", None))
    with pytest.raises(CommandError, match="event key .* NUL character"):  # not a DataError on PostgreSQL
        call_command("everystep_send_event", str(waiter.id), "k\x00")
    assert Workflow.objects.get(id=waiter.id).status == "waiting"


def test_a_rerun_keeps_a_stopped_runs_wait_as_a_wait_not_as_an_uncertain_step():
    from everystep import history

    # Branch 0 sleeps (1.0.1 started); branch 1 recorded its step (1.1.1) first
    # (written here: which branch gets there first is the threads' race).
    run = run_once(schedule(w.naps_in_a_branch, 3600))
    wake_at = Wait.objects.get(run=run).wake_at
    Step.objects.get_or_create(
        workflow_id=run.id, step_id="1.1.1",
        defaults={"name": "tests.waits.workflows.note", "status": "done", "result": "beside"},
    )
    operations.stop_run(run.id)
    cut = history.rerun_preview(run.id, "1.1.1")
    assert [row.step_id for row in cut.discarded] == ["1.1.1"]
    assert cut.uncertain == ()  # the kept sleep is no uncertain effect
    history.rerun_from_step(run.id, "1.1.1")
    run = run_once(Workflow.objects.get(id=run.id))
    assert run.status == "waiting"  # at the same sleep, until the same time
    assert Wait.objects.get(run=run).wake_at == wake_at
