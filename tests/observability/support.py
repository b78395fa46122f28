"""Ways to end a run other than completing it, for the tests of what is (not) reported."""

from everystep import runner
from everystep.api import schedule
from everystep.errors import DrainOrphan, SimulatedCrash
from everystep.models import Step, Workflow
from tests.core import workflows as w
from tests.helpers import CLAIMER, claim, run_once


def drain_after(steps: int):
    """A leave_check that asks the run to leave after ``steps`` step boundaries."""
    calls = []

    def leave_check():
        calls.append(1)
        if len(calls) > steps:
            return DrainOrphan("the worker is shutting down")
        return None

    return leave_check


def crash_at(target: str) -> None:
    def fault(ctx, step_id):
        if step_id == target:
            runner.fault = None  # the process dies once
            raise SimulatedCrash(step_id)

    runner.fault = fault


def fence_at(target: str) -> None:
    """Another worker takes the run over while step ``target`` runs."""

    def fault(ctx, step_id):
        if step_id == target:
            runner.fault = None
            Workflow.objects.filter(id=ctx.workflow_id).update(claimed_by="someone-else")

    runner.fault = fault


def blocked_run(claimer: str = CLAIMER) -> Workflow:
    """A run whose unsafe step was left ``started`` by a dead worker, replayed: it blocks."""
    run = claim(schedule(w.pays, 10), claimer)
    Step.objects.create(workflow=run, step_id="1", name="tests.core.workflows.charge", status="started")
    runner.execute(run, claimer)
    return Workflow.objects.get(id=run.id)


def resume(run: Workflow, claimer: str = CLAIMER) -> Workflow:
    """Replay a run left ``running`` (crash) or requeued (drain) to its end."""
    run.refresh_from_db()
    if run.status == Workflow.Status.SCHEDULED:
        return run_once(run, claimer)
    runner.execute(run, claimer)
    return Workflow.objects.get(id=run.id)
