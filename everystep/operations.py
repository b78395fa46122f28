"""Status transitions of a run, one function each, shared by the worker, the
management commands and the UI.

Every transition is a guarded UPDATE: it filters on the id and the status (and
claimer) it expects and reports whether it matched, so a caller that lost a
race writes nothing. Nothing here reads a row, changes it in Python and saves.
"""

import uuid
from typing import Any

from django.db import transaction
from django.utils import timezone

from .errors import EverystepError, StepFailure
from .models import Step, Workflow
from .serde import encode_exception

Status = Workflow.Status
_MISSING = object()


def parse_run_id(value: Any) -> uuid.UUID:
    """A run id as a UUID, or ``EverystepError`` naming the bad value."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise EverystepError(f"{value!r} is not a valid run id (expected a UUID)") from None


def finish_run(run_id, claimer: str, status: str, *, result=None, error=None) -> bool:
    """``running`` under ``claimer`` -> a terminal status. False if the run moved on."""
    return bool(
        Workflow.objects.filter(id=run_id, status=Status.RUNNING, claimed_by=claimer).update(
            status=status, result=result, error=error, completed_at=timezone.now()
        )
    )


def release_run(run_id, claimer: str) -> bool:
    """``running`` under ``claimer`` -> ``scheduled`` with no claimer (drain at shutdown)."""
    return bool(
        Workflow.objects.filter(id=run_id, status=Status.RUNNING, claimed_by=claimer).update(
            status=Status.SCHEDULED, claimed_by=None
        )
    )


def resolve_step(
    run_id, step_id: str, *, result: Any = _MISSING, error: str | None = None, discard: bool = False
) -> Workflow:
    """Resolve the ``started`` step of a ``blocked`` run and put the run back to ``scheduled``.

    Exactly one of ``result`` (record ``done`` with that value), ``error``
    (record ``failed`` as a ``StepFailure`` carrying the message) or
    ``discard`` (delete the row, so the step runs on the next claim).
    Refuses with ``EverystepError`` and changes nothing when the run is not
    blocked or the step is not its ``started`` step.
    """
    chosen = [result is not _MISSING, error is not None, discard]
    if sum(chosen) != 1:
        raise EverystepError(
            "choose exactly one resolution: a result, an error message, or discard"
        )
    if error is not None and not str(error).strip():
        raise EverystepError("the error message must not be empty")
    run_id = parse_run_id(run_id)
    with transaction.atomic():
        run = Workflow.objects.select_for_update().filter(id=run_id).first()
        if run is None:
            raise EverystepError(f"run {run_id} does not exist")
        if run.status != Status.BLOCKED:
            raise EverystepError(
                f"run {run_id} is {run.status}, not blocked: only a blocked run can be resolved"
            )
        started = Step.objects.filter(workflow=run, status=Step.Status.STARTED)
        step = started.filter(step_id=step_id).first()
        if step is None:
            ids = ", ".join(started.values_list("step_id", flat=True)) or "none"
            raise EverystepError(
                f"step {step_id!r} is not a started step of run {run_id} (started steps: {ids})"
            )
        if discard:
            step.delete()
        elif error is not None:
            Step.objects.filter(pk=step.pk).update(
                status=Step.Status.FAILED, error=encode_exception(StepFailure(str(error)))
            )
        else:
            Step.objects.filter(pk=step.pk).update(status=Step.Status.DONE, result=result)
        Workflow.objects.filter(id=run_id, status=Status.BLOCKED).update(
            status=Status.SCHEDULED, error=None, claimed_by=None, completed_at=None
        )
    run.refresh_from_db()
    return run
