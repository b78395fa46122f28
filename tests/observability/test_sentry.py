import pytest
import sentry_sdk

from everystep.models import Workflow
from tests.core import workflows as w
from tests.helpers import run_workflow
from tests.observability import support
from tests.observability.workflows import branch_fails

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_failed_run_is_reported_once_with_its_workflow_and_id(sentry_events):
    row = run_workflow(w.failing, claimer="worker-a")
    assert row.status == "failed"
    assert len(sentry_events) == 1
    event = sentry_events[0]
    [exception] = event["exception"]["values"]
    assert (exception["type"], exception["value"]) == ("ValueError", "nope")
    name = w.failing.__everystep__.name
    assert event["contexts"]["everystep"] == {"workflow": name, "run_id": str(row.id), "runner": "worker-a"}
    assert event["tags"]["everystep.workflow"] == name
    assert event["tags"]["everystep.run_id"] == str(row.id)
    assert event["tags"]["everystep.runner"] == "worker-a"


def test_a_failure_in_a_branch_thread_is_reported_once(sentry_events):
    row = run_workflow(branch_fails)
    assert row.status == "failed"
    assert [e["exception"]["values"][-1]["value"] for e in sentry_events] == ["in a branch"]
    assert sentry_events[0]["contexts"]["everystep"]["run_id"] == str(row.id)


def test_a_run_failing_again_on_replay_is_reported_for_that_failure_only(sentry_events):
    row = run_workflow(w.failing)
    Workflow.objects.filter(id=row.id).update(status="scheduled", completed_at=None, error=None)
    assert support.resume(row).status == "failed"  # the recorded failure replays
    assert len(sentry_events) == 2  # one per failed end, none for the steps


def test_a_failed_step_the_body_handles_is_not_reported(sentry_events):
    assert run_workflow(w.cleanup_on_failure).status == "completed"
    assert run_workflow(w.one_branch_failure).status == "completed"
    assert sentry_events == []


def test_stopped_blocked_drained_fenced_and_crashed_runs_are_not_reported(sentry_events):
    assert run_workflow(w.terminal_then_more).status == "stopped"
    assert run_workflow(w.terminal_in_branch).status == "stopped"
    assert support.blocked_run().status == "blocked"
    assert run_workflow(w.failing, leave_check=support.drain_after(1)).status == "scheduled"
    support.fence_at("2")  # the failing step's record is fenced: the run moved on
    fenced = run_workflow(w.failing)
    assert (fenced.status, fenced.claimed_by) == ("running", "someone-else")
    support.crash_at("2")
    assert run_workflow(w.failing).status == "running"
    assert sentry_events == []


def test_nothing_is_reported_when_the_project_did_not_initialise_sentry():
    assert not sentry_sdk.get_client().is_active()
    assert run_workflow(w.failing).status == "failed"
    assert not sentry_sdk.get_client().is_active()  # everystep never initialises it


def test_a_run_of_an_unknown_workflow_is_reported_with_the_reason(sentry_events):
    run = Workflow.objects.create(name="gone.workflow", status="running", claimed_by="worker-a")
    assert support.resume(run, "worker-a").status == "failed"
    [event] = sentry_events
    [exception] = event["exception"]["values"]
    assert exception["type"] == "EverystepError" and "gone.workflow" in exception["value"]
    assert event["contexts"]["everystep"]["run_id"] == str(run.id)


def test_a_run_the_worker_fails_before_its_body_is_reported(monkeypatch, sentry_events):
    # Its recorded step result no longer decodes: the worker fails it from the engine's side.
    row = support.run_with_an_unreadable_step(monkeypatch, "worker-a")
    reported = [event for event in sentry_events if event.get("contexts", {}).get("everystep")]
    assert len(reported) == 1
    assert reported[0]["contexts"]["everystep"]["run_id"] == str(row.id)
