"""Status transitions of a run, one function each, shared by the worker, the
management commands and the UI.

Every transition is a guarded UPDATE: it filters on the id and the status (and
claimer) it expects and reports whether it matched, so a caller that lost a
race writes nothing. Nothing here reads a row, changes it in Python and saves.
"""

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError
from django.db.models import Exists, OuterRef
from django.utils import timezone

from . import children, cron, database, registry, serde, statements, waits
from .errors import EverystepError, RefusedByDatabase, StepFailure, Terminal
from .models import ChildRun, Heartbeat, Step, Wait, Workflow
from .scheduling import notify_control, notify_scheduled
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
    """``running`` under ``claimer`` -> a terminal status. False if the run moved on.

    The guarded UPDATE is written in SQL (``everystep.statements``): every run
    ends through it, and the ORM would spend as long building it as sending it.
    """
    return statements.finish_run(run_id, claimer, status, result=result, error=error)


def release_run(run_id, claimer: str) -> bool:
    """``running`` under ``claimer`` -> ``scheduled`` with no claimer (drain at shutdown)."""
    return bool(
        Workflow.objects.filter(id=run_id).running_under(claimer).update(
            status=Status.SCHEDULED, claimed_by=None
        )
    )


def resolvable_steps(run_id):
    """The ``started`` rows of a run that :func:`resolve_step` settles, in
    recording order: a wait's started row is not an effect to settle
    (``wake_now`` ends a wait)."""
    started = Step.objects.filter(workflow_id=run_id, status=Step.Status.STARTED)
    return started.exclude(name__in=waits.WAIT_STEP_NAMES).order_by("id")


def mark_of(ids) -> str:
    """Names the step rows an operator was shown (their ids, in recording
    order), to pass back as ``expected_mark``: how many, and the last one's id
    (``history.Cut.mark`` is one too). A row is only ever added with a higher id, so
    a row added or deleted since changes it, also with the run back in the
    status it had (another operator acted and it came back)."""
    ids = list(ids)
    return f"{len(ids)}:{ids[-1] if ids else 0}"


def waits_mark(run_id) -> str:
    """Names the waits an operator was shown, to pass back to :func:`wake_now`
    as ``expected_mark``: their rows, by id, as :func:`mark_of` names step
    rows. Not by step id: a run re-run from a wait waits again at the same
    step id, in a new row."""
    return mark_of(Wait.objects.filter(run_id=run_id).order_by("id").values_list("id", flat=True))


def retry_mark(discarded, completed_at) -> str:
    """Names what a Retry confirmation showed, to pass back to :func:`retry_run`
    as ``expected_mark``: the rows to discard (:func:`retry_preview`) and the
    run's end. A run retried and ended again meanwhile has another end, also
    when it has no row to discard (a stopped run)."""
    return f"{mark_of(row.id for row in discarded)} {completed_at.isoformat() if completed_at else '-'}"


def _check_mark(run_id, expected_mark: str | None, mark: str, what: str) -> None:
    """Refuses, under the run row's lock, an operation whose rows changed since
    the operator was shown them (``expected_mark``; ``None``: not asked)."""
    if expected_mark is not None and expected_mark != mark:
        raise EverystepError(
            f"run {run_id} moved on: {what} changed since they were shown; nothing was changed"
        )


def resolve_step(
    run_id,
    step_id: str,
    *,
    result: Any = _MISSING,
    error: str | None = None,
    discard: bool = False,
    expected_mark: str | None = None,
) -> Workflow:
    """Resolve the ``started`` step of a ``blocked`` run and put the run back to ``scheduled``.

    Exactly one of ``result`` (record ``done`` with that value), ``error``
    (record ``failed`` as a ``StepFailure`` carrying the message) or
    ``discard`` (delete the row, so the step runs on the next claim).
    Refuses with ``EverystepError`` and changes nothing when the run is not
    blocked, the step is not its ``started`` step, or its started rows are
    not ``expected_mark`` (``mark_of()`` of the rows the operator was shown);
    with :class:`~everystep.errors.RefusedByDatabase` when the database
    refuses the result.
    """
    chosen = [result is not _MISSING, error is not None, discard]
    if sum(chosen) != 1:
        raise EverystepError(
            "choose exactly one resolution: a result, an error message, or discard"
        )
    if error is not None and not str(error).strip():
        raise EverystepError("the error message must not be empty")
    if error is not None:
        serde.check_text("the error message", str(error))
    serde.check_text("the step id", str(step_id))
    run_id = parse_run_id(run_id)
    with database.atomic():
        run = Workflow.objects.select_for_update().filter(id=run_id).first()
        if run is None:
            raise EverystepError(f"run {run_id} does not exist")
        if run.status != Status.BLOCKED:
            raise EverystepError(
                f"run {run_id} is {run.status}, not blocked: only a blocked run can be resolved"
            )
        started = resolvable_steps(run_id)
        # Another operator may have resolved the attempt shown and the step
        # blocked again: the outcome found out is not the new attempt's.
        _check_mark(run_id, expected_mark, mark_of(started.values_list("id", flat=True)), "its started steps")
        step = started.filter(step_id=step_id).first()
        if step is None:
            ids = ", ".join(started.values_list("step_id", flat=True)) or "none"
            raise EverystepError(
                f"step {step_id!r} is not a started step of run {run_id} (started steps: {ids})"
            )
        if discard:
            # Through everystep's manager, as the updates below: its database, not a router's.
            Step.objects.filter(pk=step.pk).delete()
        elif error is not None:
            Step.objects.filter(pk=step.pk).update(
                status=Step.Status.FAILED, error=encode_exception(StepFailure(str(error)))
            )
        else:
            try:
                Step.objects.filter(pk=step.pk).update(status=Step.Status.DONE, result=result)
            except IntegrityError as exc:  # MariaDB's JSON check: nesting past 32 levels
                raise RefusedByDatabase(
                    f"the database refused the result of step {step_id!r}, nothing was changed: {exc}"
                ) from None
        Workflow.objects.filter(id=run_id, status=Status.BLOCKED).update(
            status=Status.SCHEDULED, error=None, claimed_by=None, completed_at=None
        )
        notify_scheduled()  # an idle worker picks the run up at once
    # From everystep's database, not where the project's routers send Workflow reads.
    run.refresh_from_db(using=database.alias())
    return run


# ---------------------------------------------------------------- operator transitions

STOPPABLE = (Status.SCHEDULED, Status.RUNNING, Status.BLOCKED, Status.WAITING)
RETRYABLE = (Status.FAILED, Status.STOPPED)
REQUEUEABLE = (Status.RUNNING,)
# A batch is one SELECT ... LIMIT and one DELETE of that many ids: a bigger one
# holds its locks longer for no gain (and past 2**63 no database takes the LIMIT).
MAX_PRUNE_BATCH = 100_000


@dataclass(frozen=True)
class DiscardedStep:
    """A step row that a retry deletes; ``unsafe``: ``registry.repeat_risk`` of
    its function (empty when it is safe to repeat)."""

    id: int
    step_id: str
    name: str
    status: str
    unsafe: str


def stop_run(run_id, *, actor: str | None = None, expected_status: str | None = None) -> Workflow:
    """``scheduled``/``running``/``blocked``/``waiting`` -> ``stopped``, with an encoded ``Terminal``.

    A waiting run's wait rows are deleted with it: it never wakes (a retry
    replays its wait, with the wake time recorded on the first pass).

    A worker running the run starts no further step: on PostgreSQL it hears a
    NOTIFY and leaves at the next step boundary; elsewhere its next step write
    is fenced out (so at most the step in flight, or the next one, still runs).
    """
    run_id = parse_run_id(run_id)
    statuses = _allowed_from(run_id, expected_status, STOPPABLE, "stopped")
    reason = f"stopped by an operator ({actor})" if actor else "stopped by an operator"
    with database.atomic():
        updated = Workflow.objects.filter(id=run_id, status__in=statuses).update(
            status=Status.STOPPED,
            error=encode_exception(Terminal(reason)),
            completed_at=timezone.now(),
        )
        if not updated:
            raise _refusal(run_id, expected_status, STOPPABLE, "stopped")
        Wait.objects.filter(run_id=run_id).delete()
        children.wake_waiters(run_id)  # a parent waiting for it raises ChildStopped
        notify_control(run_id)
    return Workflow.objects.get(id=run_id)


def retry_preview(run_id) -> list[DiscardedStep]:
    """The step rows :func:`retry_run` would discard now, in recording order."""
    run_id = parse_run_id(run_id)
    if not Workflow.objects.filter(id=run_id).exists():
        raise EverystepError(f"run {run_id} does not exist")
    return _discardable(run_id)


def retry_run(
    run_id, *, expected_status: str | None = None, expected_mark: str | None = None
) -> list[DiscardedStep]:
    """``failed``/``stopped`` -> ``scheduled``, discarding the step rows from the
    first ``failed`` one onward (so the failed step runs again) and clearing the
    run's end. One transaction on the locked run row; returns what was discarded.
    ``expected_mark``: ``retry_mark()`` of what the operator was shown;
    nothing is written if the rows to discard or the run's end are others now."""
    run_id = parse_run_id(run_id)
    statuses = _allowed_from(run_id, expected_status, RETRYABLE, "retried")
    with database.atomic():
        status, completed_at = (
            Workflow.objects.select_for_update()
            .filter(id=run_id)
            .values_list("status", "completed_at")
            .first()
        ) or (None, None)
        if status not in statuses:
            raise _refusal(run_id, expected_status, RETRYABLE, "retried")
        discarded = _discardable(run_id)
        # Retried and ended again meanwhile, it may discard rows (unsafe ones)
        # never shown, or restart a run another operator stopped on purpose.
        mark = retry_mark(discarded, completed_at)
        _check_mark(run_id, expected_mark, mark, "the step rows to discard or the run's end")
        Step.objects.filter(id__in=[row.id for row in discarded]).delete()
        Workflow.objects.filter(id=run_id, status=status).update(
            status=Status.SCHEDULED, error=None, result=None, completed_at=None, claimed_by=None
        )
        notify_scheduled()
    return discarded


def _discardable(run_id) -> list[DiscardedStep]:
    steps = Step.objects.filter(workflow_id=run_id).order_by("id")
    first_failed = steps.filter(status=Step.Status.FAILED).values_list("id", flat=True).first()
    if first_failed is None:
        return []
    rows = steps.filter(id__gte=first_failed).values_list("id", "step_id", "name", "status")
    return [
        DiscardedStep(pk, step_id, name, status, registry.repeat_risk(name))
        for pk, step_id, name, status in rows
    ]


def requeue_run(
    run_id, *, expected_status: str | None = Status.RUNNING, expected_claimer: str | None = None
) -> Workflow:
    """``running`` -> ``scheduled`` with no claimer: for a run parked by a crashed
    worker. A live claimer is fenced out (it writes nothing more for this claim).
    ``expected_claimer``: only while that worker holds the run (the one the
    operator believes dead), not a worker that claimed it since."""
    run_id = parse_run_id(run_id)
    if expected_claimer is not None:
        serde.check_text("the claimer", expected_claimer)
    _allowed_from(run_id, expected_status, REQUEUEABLE, "requeued")
    with database.atomic():
        running = Workflow.objects.filter(id=run_id)
        if expected_claimer is None:
            running = running.filter(status=Status.RUNNING)
        else:
            running = running.running_under(expected_claimer)
        updated = running.update(status=Status.SCHEDULED, claimed_by=None)
        if not updated:
            still_running = Workflow.objects.filter(id=run_id, status=Status.RUNNING)
            claimer = still_running.values_list("claimed_by", flat=True).first()
            if expected_claimer is not None and claimer is not None:
                raise EverystepError(
                    f"run {run_id} moved on: it is running under {claimer} now, not "
                    f"{expected_claimer}; nothing was changed"
                )
            refusal = _refusal(run_id, expected_status, REQUEUEABLE, "requeued")
            if f"is {Status.WAITING}:" in str(refusal):
                refusal = EverystepError(f"{refusal} (a waiting run holds no worker: wake it with wake_now)")
            raise refusal
        notify_control(run_id)
        notify_scheduled()
    return Workflow.objects.get(id=run_id)


def wake_now(run_id, *, actor: str | None = None, expected_mark: str | None = None) -> Workflow:
    """``waiting`` -> ``scheduled`` at once, its wait ended as if its time had come.

    The wait's step is recorded here, in the same transaction, so that the
    replay serves it: a sleep (``sleep``, ``sleep_until``) returns ``None``
    as it would at its wake time; an event wait with a timeout raises
    :class:`~everystep.errors.WaitTimeout` (its message names the operator),
    as it would at its timeout. An event that comes later is kept but no
    longer served to that wait. Refuses, changing nothing, a run that is not
    waiting and a run waiting for an event without a timeout (send it the
    event instead: :func:`everystep.send_event`). ``expected_mark``:
    ``waits_mark()`` of the waits the operator was shown; nothing is
    written if the run waits elsewhere now.
    """
    from .errors import WaitTimeout
    from .models import Wait

    run_id = parse_run_id(run_id)
    who = f" ({actor})" if actor else ""
    with database.atomic():
        locked = Workflow.objects.select_for_update().filter(id=run_id)
        status = locked.values_list("status", flat=True).first()
        if status is None:
            raise EverystepError(f"run {run_id} does not exist")
        if status != Status.WAITING:
            raise EverystepError(
                f"run {run_id} is {status}: only a waiting run can be woken; nothing was changed"
            )
        # The wait shown may have ended and the run waits at a later step now.
        _check_mark(run_id, expected_mark, waits_mark(run_id), "the waits")
        pending = list(Wait.objects.filter(run_id=run_id))
        for wait in pending:
            if wait.kind == Wait.Kind.EVENT and wait.wake_at is None:
                raise EverystepError(
                    f"run {run_id} waits for event {wait.key!r} without a timeout: send it the event "
                    "(send_event) instead; nothing was changed"
                )
            if wait.kind not in (Wait.Kind.TIME, Wait.Kind.EVENT):
                raise EverystepError(
                    f"run {run_id} waits for a {wait.kind}, which only its end wakes; nothing was changed"
                )
        for wait in pending:
            if wait.kind == Wait.Kind.TIME:
                changes = {"status": Step.Status.DONE, "result": None}
            else:
                timeout = WaitTimeout(f"woken by an operator{who} before event {wait.key!r} came")
                changes = {"status": Step.Status.FAILED, "error": encode_exception(timeout)}
            Step.objects.filter(workflow_id=run_id, step_id=wait.step_id, status=Step.Status.STARTED).update(
                **changes
            )
        waits.wake(run_id)
    return Workflow.objects.get(id=run_id)


def requeue_claimer(name: str) -> list[uuid.UUID]:
    """Requeue every run left ``running`` under worker ``name``; returns their ids."""
    if not name or not name.strip():
        raise EverystepError("a claimer name must not be empty")
    serde.check_text("the claimer name", name)
    with database.atomic():
        return _requeue_parked(name)


def requeue_stale_worker(name: str, stale_after: float) -> list[uuid.UUID]:
    """Requeue every run left ``running`` under worker ``name``, only while its
    heartbeat is more than ``stale_after`` seconds old; returns their ids.

    The heartbeat row is locked first: a worker that came back (its heartbeat
    written meanwhile) keeps its runs, and a beat that waits on the lock finds
    them requeued. A name that never wrote a heartbeat (a worker older than
    heartbeats) is never matched. A worker that was only paused is fenced
    out: NOTIFY on PostgreSQL, its next step write matching nothing elsewhere.
    """
    with database.atomic():
        stale = Heartbeat.objects.select_for_update().filter(name=name).stale(stale_after)
        if not list(stale.values_list("id", flat=True)):
            return []
        return _requeue_parked(name)


def _requeue_parked(name: str) -> list[uuid.UUID]:
    """``running`` under ``name`` -> ``scheduled``, in the caller's transaction."""
    ids = list(Workflow.objects.parked_by(name).select_for_update().values_list("id", flat=True))
    if not ids:
        return []
    Workflow.objects.filter(id__in=ids, status=Status.RUNNING, claimed_by=name).update(
        status=Status.SCHEDULED, claimed_by=None
    )
    for run_id in ids:
        notify_control(run_id)
    notify_scheduled()
    return ids


def _allowed_from(run_id, expected_status, allowed, done: str) -> tuple:
    """The statuses the guarded UPDATE may match: the one the operator saw, or all allowed."""
    if expected_status is None:
        return tuple(allowed)
    if expected_status not in allowed:
        raise EverystepError(
            f"run {run_id}: a {expected_status} run cannot be {done} "
            f"(only a {' or '.join(allowed)} one can)"
        )
    return (expected_status,)


def _refusal(run_id, expected_status, allowed, done: str) -> EverystepError:
    """Why a guarded UPDATE matched nothing, for the operator; nothing was changed."""
    status = Workflow.objects.filter(id=run_id).values_list("status", flat=True).first()
    if status is None:
        return EverystepError(f"run {run_id} does not exist")
    if expected_status is not None and status != expected_status:
        return EverystepError(
            f"run {run_id} moved on: it is {status} now, not {expected_status}; nothing was changed"
        )
    return EverystepError(
        f"run {run_id} is {status}: only a {' or '.join(allowed)} run can be {done}; nothing was changed"
    )


# ---------------------------------------------------------------- retention

# The oldest cutoff prune takes, in days (100 years): older than any run, and
# far inside what every backend's datetime (and Python's) can hold.
PRUNE_MAX_DAYS = 36525


def prune(
    *,
    older_than: dt.timedelta,
    statuses=None,
    batch: int = 500,
    dry_run: bool = False,
) -> int:
    """Delete runs (and their steps) that ended more than ``older_than`` ago.

    ``statuses`` defaults to completed, failed and stopped: a ``blocked`` run
    waits for an operator and is pruned only when asked for by name. Never a
    non-terminal run. Deletes in batches of ``batch`` runs, each its own
    transaction on locked rows (so a run retried meanwhile is not deleted).
    A run waiting for a deleted child is woken in that transaction: it
    raises ``ChildFailed`` saying the child was deleted. Each cron workflow's
    newest ``cron:`` run is kept (see ``_newest_slot_runs``), and a child
    while its parent is (see ``_unlinked``).
    Returns how many runs were deleted (or would be, with ``dry_run``: a
    child counted when its parent is, looking one generation up only, so a
    grandchild of a kept run is counted though it is kept).
    """
    statuses = _prunable(statuses)
    if not 1 <= batch <= MAX_PRUNE_BATCH:
        raise EverystepError(f"the batch size must be 1 to {MAX_PRUNE_BATCH:,}, got {batch}")
    if older_than < dt.timedelta(0):
        raise EverystepError("the age cutoff must not be negative")
    if older_than > dt.timedelta(days=PRUNE_MAX_DAYS):
        raise EverystepError(f"the age cutoff must be at most {PRUNE_MAX_DAYS} days (100 years)")
    old = Workflow.objects.filter(
        status__in=statuses, completed_at__lt=timezone.now() - older_than
    ).order_by()
    if dry_run:
        names = old.filter(idempotency_key__startswith=cron.KEY_PREFIX).values_list("name", flat=True)
        kept = _newest_slot_runs(set(names.distinct()), {})
        prunable = old.exclude(id__in=kept) if kept else old
        return prunable.exclude(
            Exists(ChildRun.objects.filter(child_id=OuterRef("id")).exclude(parent_id__in=prunable))
        ).count()
    from .history import BATCH  # ids per IN list; history imports this module

    deleted = 0
    newest: dict[str, int | None] = {}  # each cron workflow's newest slot run, kept
    while True:
        with database.atomic():
            kept = [run_id for run_id in newest.values() if run_id is not None]
            rows = list(
                (old.exclude(id__in=kept) if kept else old)
                .filter(_unlinked())
                .select_for_update()
                .values_list("id", "name", "idempotency_key")[:batch]
            )
            if not rows:
                return deleted
            names = {name for _, name, key in rows if key and key.startswith(cron.KEY_PREFIX)}
            kept = _newest_slot_runs(names - newest.keys(), newest)
            ids = [run_id for run_id, _, _ in rows if run_id not in kept]
            ids += _old_descendants(old, ids, batch - len(ids), BATCH)
            # A batch may hold more ids than a statement takes parameters.
            for start in range(0, len(ids), BATCH):
                chunk = ids[start : start + BATCH]
                _wake_waiters_of(chunk)
                Workflow.objects.filter(id__in=chunk, status__in=statuses).only("id").delete()
        deleted += len(ids)


def _unlinked():
    """Runs no living run started with ``start_child``: a child is kept while
    its parent is, as re-running the parent from before its ``start_child``
    finds that child again by its key (a new one would repeat its effects).
    Its old descendants go in its batch (``_old_descendants``): never before
    it, no query per run."""
    return ~Exists(ChildRun.objects.filter(child_id=OuterRef("id")))


def _old_descendants(old, parents: list, room: int, chunk: int) -> list:
    """The runs of ``old`` that ``parents`` started with ``start_child``, then
    theirs, locked, at most ``room``: deleted in their parents' batch, so that
    a chain of children takes one batch, not a batch (and a scan of the runs
    still linked) per generation. One query per generation and ``chunk`` parents."""
    found: list = []
    generation = parents
    while generation and len(found) < room:
        started = []
        for start in range(0, len(generation), chunk):
            parents_here = generation[start : start + chunk]
            rows = old.filter(parent_link__parent_id__in=parents_here).select_for_update()
            started += rows.values_list("id", flat=True)[: room - len(found) - len(started)]
            if len(found) + len(started) >= room:
                break
        found += started
        generation = started
    return found


def _newest_slot_runs(names, newest: dict) -> set:
    """The ids of the newest ``cron:`` run of each workflow named (one index
    lookup each, remembered in ``newest``), with those already in ``newest``.

    Prune keeps them: the runs are a schedule's only record, and a worker takes
    the newest ``cron:`` key for its last started slot. Were that run deleted
    and an older one kept (a ``blocked`` run, or one of a status not pruned),
    a restarted worker would start the newest slot, which already ran, again.
    Keeping it, rather than guessing at start-up whether a slot ran, is right
    whatever was pruned: a slot without a run is then always one that did not
    start."""
    for name in names:
        newest[name] = getattr(cron.last_run(name), "id", None)
    return {run_id for run_id in newest.values() if run_id is not None}


def _wake_waiters_of(run_ids) -> None:
    """``children.wake_waiters`` for runs about to be deleted, with one read
    per chunk: a run waiting for one of them (a blocked child; an ended one
    woke its waiters as it ended) would otherwise wait forever, as nothing
    ends a deleted run. A child is kept while its parent is (``_unlinked``),
    so such a run is mostly a fork waiting for a child of its pruned original. Woken, it
    replays the wait and finds the child gone (``ChildFailed``). The caller
    locked the runs' rows first, as a child's end does."""
    keys = [str(run_id) for run_id in run_ids]
    waiting = Wait.objects.filter(kind=children.WAIT_KIND, key__in=keys).order_by()
    for run_id, key in waiting.values_list("run_id", "key"):
        waits.wake(run_id, kind=children.WAIT_KIND, key=key)


def _prunable(statuses) -> list[str]:
    if statuses is None:
        return [Status.COMPLETED, Status.FAILED, Status.STOPPED]
    terminal = Status.terminal_values()
    refused = [status for status in statuses if status not in terminal]
    if refused:
        raise EverystepError(
            f"cannot prune runs in status {', '.join(map(str, refused))}: only terminal runs "
            f"({', '.join(terminal)}) can be pruned"
        )
    if not statuses:
        raise EverystepError("name at least one status to prune")
    return list(statuses)
