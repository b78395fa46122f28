"""handle.result(): the parent waits durably (``waiting``, no worker) until its
child run ends; the child's end wakes it in the same transaction; the outcome
is recorded in the parent once; a failed or stopped child raises a named
exception carrying the child's error; a blocked child keeps the parent waiting."""

import datetime as dt

import pytest

from everystep import children, operations, runner, waits
from everystep.api import schedule
from everystep.errors import SimulatedCrash
from everystep.models import ChildRun, Step, Wait, Workflow
from tests.core import child_workflows as cw
from tests.core import workflows as w
from tests.helpers import CLAIMER, claim, crash_before_end, run_once

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_parent(kind="ok", arg="a") -> tuple[Workflow, Workflow]:
    parent = run_once(schedule(cw.parent_of, kind, arg))
    assert parent.status == "waiting"
    child = Workflow.objects.get(parent_link__parent_id=parent.id)
    return parent, child


def status_of(run) -> str:
    return Workflow.objects.values_list("status", flat=True).get(id=run.id)


def test_the_parent_waits_without_a_worker_until_the_child_completes_then_gets_its_result():
    parent, child = waiting_parent("ok", "a")
    assert parent.claimed_by is None
    wait = Wait.objects.get(run_id=parent.id)
    assert (wait.kind, wait.key, wait.step_id, wait.wake_at) == ("child", str(child.id), "3", None)
    row = Step.objects.get(workflow_id=parent.id, step_id="3")
    assert (row.name, row.status) == ("everystep.child_result", "started")
    assert waits.wake_due() == (0, None)  # no time wakes it
    assert run_once(child).status == "completed"
    assert status_of(parent) == "scheduled"  # woken by the child's end
    assert not Wait.objects.filter(run_id=parent.id).exists()
    parent = run_once(Workflow.objects.get(id=parent.id))
    assert (parent.status, parent.result) == ("completed", {"value": "child:a", "child": str(child.id)})
    assert Step.objects.get(workflow_id=parent.id, step_id="3").status == "done"
    assert w.effects["started:a"] == 1 and w.effects["child:a"] == 1


def test_a_failed_child_raises_child_failed_carrying_its_error():
    parent, child = waiting_parent("fails", "disk full")
    assert run_once(child).status == "failed"
    parent = run_once(Workflow.objects.get(id=parent.id))
    assert parent.status == "completed"
    raised = parent.result
    assert (raised["raised"], raised["child"]) == ("ChildFailed", str(child.id))
    assert raised["original"] == "ValueError"  # exc.exception() rebuilds the child's own
    assert raised["error"] == Workflow.objects.get(id=child.id).error
    assert raised["error"]["message"] == "disk full"
    row = Step.objects.get(workflow_id=parent.id, step_id="3")
    assert (row.status, row.error["type"]) == ("failed", "everystep.errors.ChildFailed")


def test_a_child_stopped_by_a_terminal_or_an_operator_raises_child_stopped():
    parent, child = waiting_parent("stops", "no stock")
    assert run_once(child).status == "stopped"
    result = run_once(Workflow.objects.get(id=parent.id)).result
    assert (result["raised"], result["message"]) == ("ChildStopped", "no stock")

    parent, child = waiting_parent("ok", "b")
    operations.stop_run(child.id, actor="ops")  # the operator's stop wakes the parent too
    assert status_of(parent) == "scheduled"
    result = run_once(Workflow.objects.get(id=parent.id)).result
    assert (result["raised"], result["message"]) == ("ChildStopped", "stopped by an operator (ops)")
    assert w.effects["child:b"] == 0


def test_an_unhandled_child_failure_fails_the_parent_with_child_failed():
    parent = run_once(schedule(cw.lets_the_failure_fail_it))
    child = Workflow.objects.get(parent_link__parent_id=parent.id)
    run_once(child)
    parent = run_once(Workflow.objects.get(id=parent.id))
    assert parent.status == "failed"
    assert parent.error["type"] == "everystep.errors.ChildFailed"
    assert parent.error["message"] == f"child run {child.id} failed: deep"


def test_a_child_that_ended_first_is_read_at_once_without_waiting():
    parent = schedule(cw.parent_of, "ok", "c")

    def run_the_child_first(ctx, step_id):
        if ctx.state.workflow_id == parent.id and step_id == "2":
            runner.fault = None
            child = Workflow.objects.get(parent_link__parent_id=parent.id)
            run_once(child, "other-worker")

    runner.fault = run_the_child_first
    parent = run_once(parent)
    assert (parent.status, parent.result["value"]) == ("completed", "child:c")
    assert not Wait.objects.exists()


def test_a_blocked_child_keeps_the_parent_waiting():
    parent, child = waiting_parent("ok", "d")
    claim(child)
    assert children.finish_child(child.id, CLAIMER, "blocked", error={"type": "x", "message": "uncertain"})
    assert status_of(parent) == "waiting"
    assert Wait.objects.filter(run_id=parent.id).exists()


def test_pruning_a_blocked_child_wakes_its_parent_which_raises_child_failed():
    """Nothing ends a deleted child: prune wakes the runs waiting for it in its
    delete's transaction, and the parent's replay finds the child gone."""
    parent, child = waiting_parent("ok", "d2")
    claim(child)
    assert children.finish_child(child.id, CLAIMER, "blocked", error={"type": "x", "message": "uncertain"})
    # A child is kept while its parent is (here waiting for it).
    assert operations.prune(older_than=dt.timedelta(0), statuses=["blocked"]) == 0
    assert status_of(parent) == "waiting"
    # A child whose link is gone (deleted by hand, say) is pruned, and its waiter woken.
    ChildRun.objects.filter(child_id=child.id).delete()
    assert operations.prune(older_than=dt.timedelta(0), statuses=["blocked"]) == 1
    assert status_of(parent) == "scheduled"
    assert not Wait.objects.filter(run_id=parent.id).exists()
    parent = run_once(Workflow.objects.get(id=parent.id))
    assert parent.status == "completed"
    assert (parent.result["raised"], parent.result["child"]) == ("ChildFailed", str(child.id))
    row = Step.objects.get(workflow_id=parent.id, step_id="3")
    assert "deleted before its parent read its end" in row.error["message"]
    # An error of the documented shape, so a handler's exc.error["message"] works (it was None).
    assert parent.result["error"]["type"] == "everystep.errors.ChildFailed"
    assert "deleted before its parent read its end" in parent.result["error"]["message"]


def test_a_stopped_parent_is_not_woken_by_its_childs_end():
    parent, child = waiting_parent("ok", "e")
    operations.stop_run(parent.id)
    assert run_once(child).status == "completed"
    assert status_of(parent) == "stopped"


def test_the_recorded_outcome_is_served_on_replay_whatever_the_child_does_later():
    parent, child = waiting_parent("fails", "first")
    run_once(child)
    parent = Workflow.objects.get(id=parent.id)
    with crash_before_end(), pytest.raises(SimulatedCrash):
        runner.execute(claim(parent), CLAIMER)
    # The child is retried and would now fail differently; the parent's record stands.
    operations.retry_run(child.id)
    Workflow.objects.filter(id=child.id).update(status="completed", result="later")
    operations.release_run(parent.id, CLAIMER)
    parent = run_once(Workflow.objects.get(id=parent.id))
    assert parent.result["raised"] == "ChildFailed"
    assert parent.result["error"]["message"] == "first"


def test_a_crash_while_waking_the_parent_rolls_back_the_childs_end(monkeypatch):
    parent, child = waiting_parent("ok", "f")

    def die(*args, **kwargs):
        raise SimulatedCrash("power cut between the child's end and its parent's wake-up")

    monkeypatch.setattr(waits, "wake", die)
    with pytest.raises(SimulatedCrash):
        runner.execute(claim(child), CLAIMER)
    assert status_of(child) == "running"  # the end was rolled back with the wake-up
    assert status_of(parent) == "waiting"
    monkeypatch.undo()
    operations.release_run(child.id, CLAIMER)  # the worker's restart
    assert run_once(Workflow.objects.get(id=child.id)).status == "completed"
    assert status_of(parent) == "scheduled"


def test_a_child_ending_between_the_parents_check_and_its_suspension_wakes_it_at_once(monkeypatch):
    """The parent saw the child running and is about to suspend; the child ends
    first (finding no waiting parent to wake). The suspension's own locked
    check sees the end and schedules the parent instead of leaving it waiting."""
    parent = schedule(cw.parent_of, "ok", "g")
    real_suspend = waits.suspend_run
    seen = []

    def child_ends_first(run_id, claimer, waiting):
        child = Workflow.objects.get(parent_link__parent_id=parent.id)
        seen.append(run_once(child, "other-worker").status)
        return real_suspend(run_id, claimer, waiting)

    monkeypatch.setattr(waits, "suspend_run", child_ends_first)
    assert run_once(parent).status == "scheduled"
    assert seen == ["completed"]
    assert not Wait.objects.filter(run_id=parent.id).exists()
    monkeypatch.undo()
    assert run_once(Workflow.objects.get(id=parent.id)).result["value"] == "child:g"


def test_result_outside_a_body_is_refused():
    from everystep.errors import EverystepError

    handle = children.ChildHandle("0190f4a0-0000-7000-8000-000000000000", "x")
    with pytest.raises(EverystepError, match="works only in a workflow's body"):
        handle.result()


def test_a_parent_stopped_while_waiting_and_retried_waits_for_the_same_child_again():
    parent, child = waiting_parent("ok", "h")
    operations.stop_run(parent.id)
    assert not Wait.objects.filter(run_id=parent.id).exists()
    operations.retry_run(parent.id)
    parent = run_once(Workflow.objects.get(id=parent.id))
    assert parent.status == "waiting"  # the same wait step, for the same child
    assert Wait.objects.get(run_id=parent.id).key == str(child.id)
    assert Workflow.objects.filter(parent_link__parent_id=parent.id).count() == 1
    run_once(child)
    parent = run_once(Workflow.objects.get(id=parent.id))
    assert parent.result == {"value": "child:h", "child": str(child.id)}


def test_a_fork_holding_a_copy_of_the_call_is_woken_by_the_childs_end_too():
    from everystep import history

    parent, child = waiting_parent("ok", "i")
    operations.stop_run(parent.id)
    fork, _ = history.fork_from_step(parent.id, "3")  # copies the call (1) and the step after it (2)
    fork = run_once(Workflow.objects.get(id=fork.id))
    assert fork.status == "waiting"
    assert Wait.objects.get(run_id=fork.id).key == str(child.id)  # the same child: no second one
    assert Workflow.objects.filter(name="tests.core.child_workflows.child_of").count() == 1
    run_once(child)
    assert status_of(fork) == "scheduled"
    assert run_once(Workflow.objects.get(id=fork.id)).result == {"value": "child:i", "child": str(child.id)}


def test_a_terminal_in_a_branch_stops_the_run_even_when_a_sibling_waits_for_a_child():
    """ENGINE.md: a Terminal in any branch is raised as is and the run ends
    stopped; the sibling branch's wait for its child must not make it wait."""
    parent = run_once(schedule(cw.ships_unless_cancelled))
    terminal = Step.objects.get(workflow_id=parent.id, step_id="2.1.1")
    assert terminal.status == "failed" and terminal.error["type"] == "everystep.errors.Terminal"
    assert (parent.status, parent.error["message"]) == ("stopped", "customer cancelled")
    assert not Wait.objects.filter(run_id=parent.id).exists()


def test_no_step_starts_after_a_recorded_terminal_once_the_child_ended():
    """A crash after the Terminal's row, before the run's end: once the child
    ended, the replay's shipping branch gets its result first, and must still
    start no step after the recorded Terminal."""
    parent = schedule(cw.ships_unless_cancelled)
    with crash_before_end(), pytest.raises(SimulatedCrash):
        runner.execute(claim(parent), CLAIMER)
    recorded = dict(Step.objects.filter(workflow_id=parent.id).values_list("step_id", "status"))
    assert recorded == {"1": "done", "2.0.1": "started", "2.1.1": "failed"}
    child = Workflow.objects.get(parent_link__parent_id=parent.id)
    assert run_once(child).status == "completed"
    runner.execute(Workflow.objects.get(id=parent.id), CLAIMER)  # the restarted worker resumes it
    parent = Workflow.objects.get(id=parent.id)
    assert (parent.status, parent.error["message"]) == ("stopped", "customer cancelled")
    assert w.effects["shipped:child:parcel"] == 0, "a step ran after the run had recorded its Terminal"
    assert not Step.objects.filter(workflow_id=parent.id, step_id="2.0.2").exists()
