"""Drive runs in-process, without a worker process."""

from everystep import runner
from everystep.api import schedule
from everystep.models import Workflow

CLAIMER = "test-runner"


def claim(run: Workflow, claimer: str = CLAIMER) -> Workflow:
    updated = Workflow.objects.filter(id=run.id, status=Workflow.Status.SCHEDULED).update(
        status=Workflow.Status.RUNNING, claimed_by=claimer
    )
    assert updated == 1, f"run {run.id} was not claimable"
    return Workflow.objects.get(id=run.id)


def run_once(run: Workflow, claimer: str = CLAIMER, **kwargs) -> Workflow:
    """Claim one scheduled run, replay it once, and return the refreshed row."""
    runner.execute(claim(run, claimer), claimer, **kwargs)
    return Workflow.objects.get(id=run.id)


def run_workflow(func, *args, **kwargs) -> Workflow:
    """Schedule ``func(*args)`` and execute it in-process to the end of one pass."""
    return run_once(schedule(func, *args), **kwargs)
