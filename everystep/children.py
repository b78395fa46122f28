"""Child runs: a workflow starting another workflow as a run of its own.

``start_child(child_workflow, *args)`` inside a workflow body is recorded like
a step: its row (named after the child workflow, ``done`` with the child's run
id) is what replay serves, so a replay never starts a second child. The child
is inserted with an idempotency key derived from the parent's run id and the
call's step id, and linked to its parent (``everystep_child``) in the same
transaction, fenced on the parent still running under this worker.

Invariants (what a crash at any line leaves behind):
- before the child's transaction commits: no child, no link; the next pass
  inserts them;
- after it commits, before the parent's step row is written: the child and
  its link exist; the next pass computes the same key and finds that child
  (``schedule``'s idempotency), then records the step. No second child;
- after the step row: replay serves the child's id from the store.

``handle.result()`` is a wait of kind ``child`` (``everystep.waits``): the
parent is ``waiting`` until the child ends. Every transaction that ends a
child (:func:`finish_child`, and ``operations.stop_run``) wakes the runs
waiting for it before it commits, so a crash leaves either both (the child
ended, the parent scheduled) or neither; see :func:`wake_waiters` for why a
parent suspending at that moment is never missed.
"""

import hashlib
from typing import Any

from . import database
from .context import current
from .errors import ChildFailed, ChildStopped, EverystepError
from .statuses import RunStatus as Status

# Every child's idempotency key starts with this: the runner tells a child
# run by it without a query (its end wakes a parent waiting for it).
KEY_PREFIX = "everystep.child:"
_MAX_KEY = 255
CHILD_RESULT = "everystep.child_result"  # the name of handle.result()'s wait step (waits.WAIT_STEP_NAMES)
WAIT_KIND = "child"
# The ends that wake a waiting parent; a blocked child has not ended yet.
ENDS = (Status.COMPLETED, Status.FAILED, Status.STOPPED)


def child_key(parent_id, step_id: str) -> str:
    """The idempotency key of the child started by ``parent_id`` at ``step_id``:
    the same on every pass, different for every (parent, call)."""
    key = f"{KEY_PREFIX}{parent_id}:{step_id}"
    if len(key) <= _MAX_KEY:
        return key
    # A step id may be 300 characters long; its digest keeps the key unique and bounded.
    digest = hashlib.sha256(step_id.encode()).hexdigest()
    return f"{KEY_PREFIX}{parent_id}:sha256:{digest}"


def is_child_key(idempotency_key: str | None) -> bool:
    return bool(idempotency_key) and idempotency_key.startswith(KEY_PREFIX)


def insert_child(parent_id, claimer: str, step_id: str, name: str, args: list) -> tuple | None:
    """Insert (or find, on a later pass) the child run and its link, in one
    transaction fenced on the parent: returns ``(child's run id, inserted
    now)``, or ``None`` when the parent is no longer ``running`` under
    ``claimer`` (nothing written)."""
    from .models import ChildRun, Workflow
    from .scheduling import insert_run_once

    with database.atomic():
        # Locking the parent's row makes an operator's stop or requeue wait
        # for this transaction, or this one see it and write nothing.
        owned = Workflow.objects.select_for_update().filter(id=parent_id).running_under(claimer)
        if not list(owned.values_list("id", flat=True)):
            return None
        child, inserted = insert_run_once(Workflow, name, args, child_key(parent_id, step_id))
        # The call's one link (unique per parent and step) must name this
        # child. A child found by its key (a later pass) was linked when it
        # was inserted, but the key is unique only with the workflow's name: a
        # parent re-run from before this call (everystep.history) whose body
        # now starts another workflow here inserts a second child under the
        # same key (or finds an earlier one again). A re-run runs the call
        # anew, so the link moves to this pass's child; the child it named
        # stays as it is, a run of its own. A plain read, as every link write
        # of this parent holds its row's lock (a locking read of a missing row
        # would take a MySQL gap lock that other parents' link inserts wait on).
        linked = ChildRun.objects.filter(parent_id=parent_id, step_id=step_id)
        linked = linked.values_list("child_id", flat=True).first()
        if linked != child.id:
            if linked is not None:
                ChildRun.objects.filter(child_id=linked).delete()
            ChildRun.objects.create(child_id=child.id, parent_id=parent_id, step_id=step_id)
    return child.id, inserted


def unfinished_descendants(run_id) -> list[tuple]:
    """``(run id, status)`` of the runs started by ``run_id``, their own
    children and so on, that an operator can stop (breadth first; a child
    that ended may have children of its own still running): what stopping
    ``run_id`` may stop with it."""
    from .models import ChildRun, Workflow
    from .operations import STOPPABLE

    found, level, seen = [], [run_id], {run_id}
    while level:
        children = list(ChildRun.objects.filter(parent_id__in=level).values_list("child_id", flat=True))
        children = [child for child in children if child not in seen]
        seen.update(children)
        found += list(
            Workflow.objects.filter(id__in=children, status__in=STOPPABLE)
            .order_by("id")
            .values_list("id", "status")
        )
        level = children
    return found


class ChildHandle:
    """What ``start_child`` returns: ``id`` is the child's run id."""

    def __init__(self, child_id, name: str):
        self.id = child_id
        self.name = name

    def __repr__(self):
        return f"<ChildHandle {self.name} {self.id}>"

    def result(self, everystep_id: str | None = None) -> Any:
        """Wait durably for the child run to end and return its result.

        A wait step (kind ``child``): until the child ends, the parent is
        ``waiting`` and holds no worker; the child's end wakes it. The outcome
        is recorded in the parent once, so replay returns (or raises) the
        same. A child that failed raises :class:`~everystep.errors.ChildFailed`
        here, one that was stopped :class:`~everystep.errors.ChildStopped`,
        each carrying the child's error; a ``blocked`` child keeps the parent
        waiting until an operator resolves it and it ends. Takes
        ``everystep_id=`` like a step. Only in a workflow's body.
        """
        from . import waits

        ctx = current()
        if ctx is None or ctx.running_step is not None:
            raise EverystepError(
                f"result() of child run {self.id} works only in a workflow's body, not outside a run "
                "or in a step"
            )
        child_id, key = self.id, str(self.id)

        def resolve(state, step_id, params):
            return child_outcome(child_id)

        def ready():
            return child_outcome(child_id, lock=True) is not None

        return waits.wait_step(
            CHILD_RESULT, everystep_id, args=[child_id], kind=WAIT_KIND, key=key, resolve=resolve, ready=ready
        )


def child_outcome(child_id, *, lock: bool = False) -> tuple | None:
    """How the child ended, as a wait's ``resolve`` says it: ``("done",
    result)``, ``("failed", ChildFailed | ChildStopped)``, or ``None`` while it
    has not ended (``blocked`` included: it ends once resolved). ``lock``:
    a locking read (inside the suspending transaction, where a plain read on
    MySQL could come from an older snapshot)."""
    from .models import Workflow

    rows = Workflow.objects.filter(id=child_id)
    if lock:
        rows = rows.select_for_update()
    row = rows.values_list("status", "result", "error").first()
    if row is None:
        message = f"child run {child_id} no longer exists (deleted before its parent read its end)"
        # An error of the stored shape all the same: a parent's handler reads exc.error["message"].
        error = {"type": "everystep.errors.ChildFailed", "message": message, "args": [message]}
        return "failed", ChildFailed(message, child_id, error)
    status, result, error = row
    if status == Status.COMPLETED:
        return "done", result
    if status == Status.FAILED:
        message = (error or {}).get("message", "")
        return "failed", ChildFailed(f"child run {child_id} failed: {message}", child_id, error)
    if status == Status.STOPPED:
        message = (error or {}).get("message", "")
        return "failed", ChildStopped(f"child run {child_id} was stopped: {message}", child_id, error)
    return None


# ---------------------------------------------------------------- the child's end


def wake_waiters(child_id) -> int:
    """Wake every run waiting for ``child_id`` to end, in the caller's
    transaction, which has just ended the child (its row is locked by that
    UPDATE). That is its parent, and a fork of the parent made after the
    call (it holds a copy of the call's row). Returns how many were woken.

    The child's row is locked before any waiter's: a parent suspending
    meanwhile locks its own row, then reads the child's with a lock, so it
    either committed its wait before this read (found here) or reads the
    child after this transaction (ended: it schedules itself)."""
    from . import waits
    from .models import Wait

    key = str(child_id)
    waiters = list(Wait.objects.filter(kind=WAIT_KIND, key=key).values_list("run_id", flat=True))
    return sum(waits.wake(run_id, kind=WAIT_KIND, key=key) for run_id in waiters)


def finisher(run, plain=None):
    """The transition that ends ``run``: :func:`finish_child` for a child
    (told by its idempotency key, without a query), else ``plain`` (by
    default ``operations.finish_run``)."""
    from . import operations

    if is_child_key(run.idempotency_key):
        return finish_child
    return plain or operations.finish_run


def finish_child(run_id, claimer: str, status: str, *, result=None, error=None) -> bool:
    """``operations.finish_run`` for a child run: its end and its waiting
    parent's wake-up in one transaction, so a parent waiting for it is never
    left waiting by a crash in between."""
    from . import operations

    with database.atomic():
        ended = operations.finish_run(run_id, claimer, status, result=result, error=error)
        if ended and status in ENDS:
            wake_waiters(run_id)
    return ended


def check_inside_body(ctx, name: str) -> None:
    if ctx is None:
        raise EverystepError(
            f"start_child({name}) was called outside a workflow run; outside a run, "
            "use schedule() to start a run"
        )
    if ctx.running_step is not None:
        raise EverystepError(
            f"start_child({name}) was called inside step {ctx.running_step} of run "
            f"{ctx.workflow_id}; call it from the workflow's body, where it is recorded like a step"
        )
    if ctx.connection.in_atomic_block:
        ctx.refuse_transaction(f"start_child({name})")


def stop_descendants(run_id, *, actor: str | None = None) -> list[tuple]:
    """Stop what :func:`unfinished_descendants` finds, each through the guarded
    ``operations.stop_run`` conditional on the status read, so that its
    history says truly what it was stopped from. One that moved on meanwhile
    (a worker claimed it) is read again and stopped from its new status; one
    that ended is left alone. Returns ``(run id, status before)`` of each run
    stopped."""
    from .models import Workflow
    from .operations import STOPPABLE, stop_run

    stopped = []
    for child_id, status in unfinished_descendants(run_id):
        while status in STOPPABLE:
            try:
                stop_run(child_id, actor=actor, expected_status=status)
            except EverystepError:  # it moved on since it was read
                status = Workflow.objects.filter(id=child_id).values_list("status", flat=True).first()
                continue
            stopped.append((child_id, status))
            break
    return stopped
