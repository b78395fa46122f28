"""Drive runs in-process, without a worker process."""

from contextlib import contextmanager
from unittest import mock

from everystep import operations, runner
from everystep.api import schedule
from everystep.errors import SimulatedCrash
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


@contextmanager
def crash_before_end():
    """The process dies after the run's last step record and before its end is
    written: ``runner.execute`` raises ``SimulatedCrash`` and the run is left
    ``running`` under its claimer with all its step rows."""

    def die(*args, **kwargs):
        raise SimulatedCrash("crash before the run's end was written")

    with mock.patch.object(operations, "finish_run", die):
        yield
