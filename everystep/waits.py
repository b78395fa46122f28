"""Durable waits: a run that sleeps or waits for an event leaves its worker
as ``waiting`` and is put back to ``scheduled`` when it is due.

One mechanism serves every kind of wait (``time`` for :func:`~everystep.sleep` and
:func:`~everystep.sleep_until`, ``event`` for :func:`~everystep.wait_for_event`; another kind, such
as a child run, plugs in the same way):

1. :func:`wait_step` is the wait inside the body. It takes the next step id
   (so the wait has a dotpath like any step, and a changed workflow is caught
   as a divergence) and records a ``started`` step row whose ``kwargs`` hold
   the wait's parameters (``kind``, ``key``, ``wake_at``): written once, so
   replay never moves a wake time. Then it asks the kind's ``resolve`` whether
   the wait is over: ``("done", value)`` completes the row as ``done`` with
   that value (the value the wait returns, now and on every replay),
   ``("failed", exc)`` completes it as ``failed`` (raised at the wait, now and
   on every replay), ``None`` suspends: it halts the run with
   ``everystep.errors.Suspended``.
2. The runner then calls :func:`suspend_run`: one transaction that moves the
   run ``running`` (under this claimer) -> ``waiting``, clears ``claimed_by``
   and writes the run's ``everystep_wait`` rows: one per wait it stops at
   (several in a ``parallel`` fork, see ``stopped_at``), so that each
   one's wake time and key wake the run. The worker slot is free once
   the runner returns. If the run moved on meanwhile (stopped, requeued) it
   writes nothing. If the wait became ready meanwhile (``Waiting.ready``: an
   event sent between the check and the suspension), the same transaction puts
   the run back to ``scheduled``, so no wake-up is lost.
3. A waiting run is woken by :func:`wake` (a guarded ``waiting`` ->
   ``scheduled`` transition that deletes its wait rows and NOTIFYs idle
   workers): :func:`wake_due` in every worker's loop for due wake times,
   :func:`~everystep.send_event` for events, ``operations.wake_now`` for an operator.
   The next claim replays the body; ``resolve`` now says the wait is over.

Every transition locks the run row first and the wait and event rows after,
so that two of them never deadlock and a send racing a suspension is seen by
one of the two. Times are the application's clock (``timezone.now()``) on
every side: the one that computed a wake time also judges it due.

To add a kind: call :func:`wait_step` with a ``resolve(step_id, params)``
and a ``ready`` check, write :class:`~everystep.models.Wait` rows of that
kind (``key`` names what is awaited), and call :func:`wake` for the run when
it happens (e.g. when a child run ends). ``Wait.Kind``
names the kinds stored.
"""

import datetime as dt
import logging
import math
import reprlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Min
from django.utils import timezone

from . import database, observability, runner, serde, statements
from .context import Outcome, current
from .errors import EverystepError, Fenced, RefusedByDatabase, Suspended, WaitTimeout
from .statuses import RunStatus as Status
from .statuses import StepStatus

logger = logging.getLogger("everystep")

SLEEP = "everystep.sleep"
WAIT_FOR_EVENT = "everystep.wait_for_event"
# The names wait steps are recorded under; a new kind adds its own.
CHILD_RESULT = "everystep.child_result"  # a child run's handle.result() (everystep.children)
WAIT_STEP_NAMES = {SLEEP, WAIT_FOR_EVENT, CHILD_RESULT}
MAX_KEY_LENGTH = 255
# Runs woken per transaction by wake_due; a larger backlog takes several.
WAKE_BATCH = 500
# Transactions per wake_due call: the worker loop writes its heartbeat between
# two calls, and a backlog of due runs too long to wake in one heartbeat must
# not get the worker judged dead (the loop calls again at once while runs are due).
WAKE_BATCHES = 4


@dataclass(frozen=True)
class Waiting:
    """Where a run stops: its wait step, the kind and key of what it waits
    for, its wake time (``None``: only an outside event wakes it), and
    ``ready()``, asked inside the suspending transaction after the run row is
    locked: True when the wait is over already (the run is scheduled at once)."""

    step_id: str
    kind: str
    key: str | None = None
    wake_at: dt.datetime | None = None
    ready: Callable[[], bool] = field(default=lambda: False, compare=False)


# ---------------------------------------------------------------- inside the body


def sleep(duration, everystep_id: str | None = None) -> None:
    """Sleep durably for ``duration`` (seconds, or a ``timedelta``).

    The wake time is recorded on the first pass (a ``started`` step row) and
    the run leaves its worker as ``waiting``; a worker claims it again at the
    wake time. Replay never sleeps again nor moves the wake time. Returns
    ``None`` (also when an operator wakes the run early with ``wake_now``).
    Takes ``everystep_id=`` like a step. Outside a run, a plain ``time.sleep``.
    """
    seconds = _seconds(duration)
    wake_at = _after(seconds, duration)  # also outside a run: a too large duration is refused alike
    if current() is None or current().running_step is not None:
        time.sleep(seconds)
        return None
    return _sleep_step(wake_at, [seconds], everystep_id)


def sleep_until(when: dt.datetime, everystep_id: str | None = None) -> None:
    """Sleep durably until ``when`` (an aware ``datetime``); see :func:`sleep`.
    A time in the past returns at once (still recorded, as one step)."""
    if not isinstance(when, dt.datetime) or timezone.is_naive(when):
        raise EverystepError(f"sleep_until() needs an aware datetime, got {when!r}")
    wake_at = _on_the_clock(when)
    if current() is None or current().running_step is not None:
        time.sleep(max(0.0, (wake_at - timezone.now()).total_seconds()))
        return None
    return _sleep_step(wake_at, [when], everystep_id)


def _on_the_clock(when: dt.datetime) -> dt.datetime:
    """``when`` as the clock that judges wake times gives it (``timezone.now()``):
    aware (in UTC) under ``USE_TZ``, else naive in ``TIME_ZONE``, as ``sleep()``'s
    wake times and the wait rows are there (with ``USE_TZ = False`` Django
    stores naive datetimes, and comparing an aware one with them raises)."""
    try:
        if settings.USE_TZ:
            return when.astimezone(dt.UTC)
        return timezone.make_naive(when, timezone.get_default_timezone())
    except OverflowError:  # e.g. 9999-12-31 23:00-05:00: past datetime.max once in UTC
        raise EverystepError(f"sleep_until(): {when!r} is out of the range of a wake time") from None


def _sleep_step(wake_at: dt.datetime, args: list, everystep_id: str | None) -> None:
    def resolve(state, step_id, params):
        return ("done", None) if timezone.now() >= params["wake_at"] else None

    return wait_step(SLEEP, everystep_id, args=args, kind="time", wake_at=wake_at, resolve=resolve)


def wait_for_event(key: str, timeout=None, everystep_id: str | None = None) -> Any:
    """Wait durably for the event ``key`` sent to this run with
    :func:`send_event`, and return its value.

    An event sent before the run gets here is kept and returned at once. The
    value is recorded as this wait's outcome exactly once: replay returns the
    same value. With ``timeout`` (seconds or a ``timedelta``, counted from the
    first time the run reaches the wait), :class:`~everystep.errors.WaitTimeout`
    is raised here when it passes first; the body may catch it. Meanwhile the
    run is ``waiting`` and holds no worker. Only inside a run.
    """
    _check_key(key)
    ctx = current()
    if ctx is None or ctx.running_step is not None:
        raise EverystepError(
            f"wait_for_event({key!r}) works only in a workflow's body, not outside a run or in a step"
        )
    wake_at = None if timeout is None else _after(_seconds(timeout), timeout)
    run_id = ctx.workflow_id

    def resolve(state, step_id, params):
        from .models import Event

        deadline = params["wake_at"]
        sent = Event.objects.filter(run_id=run_id, key=params["key"])
        # Sent after the deadline, the event lost to the timeout, however late
        # a worker woke the run for it: the answer must not hang on worker latency.
        if deadline is not None:
            sent = sent.filter(sent_at__lte=deadline)
        for value in sent.values_list("value", flat=True):
            return ("done", value)
        if deadline is not None and timezone.now() >= deadline:
            return ("failed", WaitTimeout(f"no event {params['key']!r} came before {deadline.isoformat()}"))
        return None

    def ready():
        return _event_sent(run_id, key)

    return wait_step(
        WAIT_FOR_EVENT, everystep_id, args=[key], kind="event", key=key, wake_at=wake_at,
        resolve=resolve, ready=ready,
    )


def wait_step(
    name: str,
    everystep_id: str | None,
    *,
    args: list,
    kind: str,
    resolve: Callable,
    key: str | None = None,
    wake_at: dt.datetime | None = None,
    ready: Callable[[], bool] | None = None,
) -> Any:
    """A wait of any kind inside the body (see the module's docstring).

    ``resolve(state, step_id, params)``: ``params`` are the recorded
    ``kind``, ``key`` and ``wake_at`` (those of the first pass, not the
    arguments given now). ``ready()``: see :class:`Waiting`; by default the
    wake time having passed.
    """
    ctx = current()
    if ctx.connection.in_atomic_block:
        ctx.refuse_transaction(f"the wait {name}")
    state = ctx.state
    step_id = ctx.next_id(everystep_id)
    recorded = state.store.get(step_id)
    # A wait reached on an earlier pass (``started``) is looked at again even
    # once a sibling branch's wait halted the run: it starts nothing, and
    # otherwise whichever branch thread ran first would decide whether its
    # timeout or event is seen (its outcome recorded, or its wait row written).
    reached_before = recorded is not None and recorded.status == StepStatus.STARTED
    if not (reached_before and isinstance(state.halt, Suspended)):
        state.check()
    if recorded is not None:
        if recorded.name != name:
            _diverged(state, step_id, recorded.name, name)
        if recorded.status != StepStatus.STARTED:
            return runner._serve_recorded(recorded)  # a replay: no span, as for steps
    tracing = runner.observer.tracing if runner.observer is not None else None
    if tracing is None or not tracing.recording():
        return _wait(ctx, step_id, name, recorded, args, kind, key, wake_at, resolve, ready)
    with tracing.wait_span(state, step_id, name, kind, key):
        return _wait(ctx, step_id, name, recorded, args, kind, key, wake_at, resolve, ready)


def _wait(ctx, step_id, name, recorded, args, kind, key, wake_at, resolve, ready) -> Any:
    """Record the wait once, then end it (its outcome recorded) or suspend the run."""
    state = ctx.state
    # Its reads are guarded as the engine's writes are: a database outage here
    # (a restart) halts the run for a requeue instead of failing it from the body.
    if recorded is not None:
        params = runner._guarded_db(state, _recorded_params, state, step_id)
    else:
        params = {"kind": kind, "key": key, "wake_at": wake_at}
        _record_started(state, step_id, name, args, params)
        runner._fault(ctx, step_id)  # a crash here leaves the started row: replay keeps its wake time
    outcome = runner._guarded_db(state, resolve, state, step_id, params)
    if outcome is None:
        deadline = params["wake_at"]
        if ready is None:
            def ready():
                return deadline is not None and timezone.now() >= deadline
        state.halt_with(Suspended(Waiting(step_id, params["kind"], params["key"], deadline, ready)))
    runner._fault(ctx, step_id)  # a crash here leaves the wait unrecorded: replay resolves it again
    status, value = outcome
    return _complete(state, step_id, name, status, value)


def _diverged(state, step_id: str, recorded: str, called: str) -> None:
    from .errors import WorkflowCodeError

    state.halt_with(
        WorkflowCodeError(
            f"run {state.workflow_id}: step {step_id} was recorded as {recorded} but the code "
            f"now calls {called} there. The workflow's code changed under a running run: "
            "deploy the old code to finish it, or stop it."
        )
    )


def _record_started(state, step_id: str, name: str, args: list, params: dict) -> None:
    try:
        recorded = runner._guarded_db(
            state,
            lambda: statements.insert_step(
                state.connection(), state.workflow_id, state.claimer, step_id, name, StepStatus.STARTED,
                args=serde.encode(args), kwargs=serde.encode(params), result=None, error=None,
                prepared=state.prepared_statements,
            ),
        )
    except IntegrityError:
        recorded = False
    if not recorded:
        state.halt_with(Fenced(f"run {state.workflow_id} moved on; wait {step_id} was not recorded"))
    state.store[step_id] = Outcome(StepStatus.STARTED, name)


def _recorded_params(state, step_id: str) -> dict:
    from .models import Step

    row = Step.objects.filter(workflow_id=state.workflow_id, step_id=step_id)
    # The field decodes what serde encoded: the wake time is a datetime again.
    return row.values_list("kwargs", flat=True).get()


def _complete(state, step_id: str, name: str, status: str, value) -> Any:
    """Complete the wait's ``started`` row, fenced like any step write."""
    from .models import Step, running_under

    if status == StepStatus.DONE:
        changes, error = {"result": value}, None
    else:
        error = serde.encode_exception(value)
        changes = {"error": error}

    def write():
        return Step.objects.filter(
            running_under(state.claimer, run="workflow__"),
            workflow_id=state.workflow_id,
            step_id=step_id,
            status=StepStatus.STARTED,
        ).update(status=status, **changes)

    if not runner._guarded_db(state, write):
        state.halt_with(Fenced(f"run {state.workflow_id} moved on; wait {step_id} was not completed"))
    state.store[step_id] = Outcome(status, name, value if error is None else None, error)
    return runner._serve_recorded(state.store[step_id])


# ---------------------------------------------------------------- transitions


def suspend_run(run_id, claimer: str, *waiting: Waiting) -> str | None:
    """``running`` under ``claimer`` -> ``waiting`` (no claimer), with one wait
    row per ``Waiting`` (several when parallel branches wait: the earliest wake
    time, or an event for any of their keys, wakes the run); ``scheduled``
    instead when one is ``ready()`` already. Returns the status written,
    ``None`` when the run moved on (nothing written)."""
    from .models import Wait, Workflow

    with database.atomic():
        moved = Workflow.objects.filter(id=run_id).running_under(claimer).update(
            status=Status.WAITING, claimed_by=None
        )
        if not moved:
            return None
        # A running run has no wait row (every wake deletes them); should one be
        # left, these waits replace it. Not a blind DELETE: on InnoDB a delete of
        # nothing takes a gap lock that deadlocks two suspensions' inserts.
        stale = Wait.objects.filter(run_id=run_id)
        if stale.exists():
            stale.delete()
        Wait.objects.bulk_create(
            Wait(run_id=run_id, step_id=each.step_id, kind=each.kind, key=each.key, wake_at=each.wake_at)
            for each in waiting
        )
        if any(each.ready() for each in waiting):
            wake(run_id)
            return Status.SCHEDULED
    return Status.WAITING


def stopped_at(state) -> list[Waiting]:
    """Every wait a suspending run stops at: those its scopes stopped at this
    pass (``state.suspended``), and any wait reached on an earlier pass (still
    ``started``) that a ``parallel`` branch did not get back to this pass,
    because a sibling's wait halted it at an earlier step boundary. Without a
    row, that wait's timeout and event would no longer wake the run."""
    waiting = {each.step_id: each for each in state.suspended}
    earlier = [
        step_id
        for step_id, outcome in state.store.items()
        if outcome.status == StepStatus.STARTED and is_wait_step(outcome.name) and step_id not in waiting
    ]
    if earlier:
        from .models import Step

        rows = Step.objects.filter(workflow_id=state.workflow_id, step_id__in=earlier)
        for step_id, params in rows.values_list("step_id", "kwargs"):
            waiting[step_id] = _recorded_waiting(state.workflow_id, step_id, params)
    return list(waiting.values())


def _recorded_waiting(run_id, step_id: str, params: dict) -> Waiting:
    """A wait not reached this pass, from its recorded parameters. ``ready``:
    its event or its child's end came while the run was running (and so could
    not wake it). Its wake time is left to :func:`wake_due` (a worker's next
    look, within a poll interval), not ``ready``: should the branch be halted
    short again on the replay, the run is not put straight back in a loop."""
    from . import children
    from .models import Wait

    kind, key = params["kind"], params["key"]

    def ready():
        if kind == Wait.Kind.EVENT:
            return _event_sent(run_id, key)
        if kind == Wait.Kind.CHILD:
            return children.child_outcome(key, lock=True) is not None
        return False

    return Waiting(step_id, kind, key, params["wake_at"], ready)


def _event_sent(run_id, key: str) -> bool:
    from .models import Event

    # A locking read: on MySQL a plain read could come from an older snapshot.
    return Event.objects.select_for_update().filter(run_id=run_id, key=key).exists()


def wake(run_id, **wait_filter) -> bool:
    """``waiting`` -> ``scheduled`` and its wait rows deleted, in the caller's
    transaction (one of its own otherwise); idle workers are NOTIFYed on
    commit. With ``wait_filter`` (e.g. ``kind="event", key=...``), only while
    the run has a wait row matching it. False if the run was not waiting (so:
    a stopped or completed run is never woken)."""
    from .models import Wait, Workflow
    from .scheduling import notify_scheduled

    with database.atomic():
        locked = Workflow.objects.select_for_update().filter(id=run_id, status=Status.WAITING)
        if not locked.values_list("id", flat=True):
            return False
        waits = Wait.objects.filter(run_id=run_id)
        if wait_filter and not waits.filter(**wait_filter).select_for_update().exists():
            return False
        Workflow.objects.filter(id=run_id, status=Status.WAITING).update(status=Status.SCHEDULED)
        waits.delete()
        notify_scheduled()
    return True


def wake_due(now: dt.datetime | None = None, *, batch: int | None = None) -> tuple[int, dt.datetime | None]:
    """Wake the waiting runs whose wake time has come, at most
    ``WAKE_BATCHES`` transactions of ``batch`` (``WAKE_BATCH``) runs;
    the worker loop calls it. Returns how many were woken and the next wake
    time (``None``: none; a time already past: more are due, call again).

    Two workers may call it at once: each locks the runs it wakes, skipping
    runs another one holds (where the database can skip locks), and the
    ``waiting`` guard lets a run be woken only once.

    Its reads use the ``wake_at`` index alone (no join to the runs): wait rows
    exist only for ``waiting`` runs, since every transition out of
    ``waiting`` deletes them in the same transaction. Should one outlive its
    run's wait all the same, it is deleted here when it comes due.
    """
    from .models import Wait, Workflow
    from .scheduling import notify_scheduled

    now = now or timezone.now()
    # The usual answer, nothing due, costs one read of the index's first entry
    # (no transaction): every worker asks each poll interval.
    first = _next_wake_at()
    if first is None or first > now:
        return 0, first
    batch = batch or WAKE_BATCH
    skip_locked = database.connection().features.has_select_for_update_skip_locked
    woken = 0
    for _ in range(WAKE_BATCHES):
        with database.atomic():
            candidates = _due_candidates(now, batch)
            if not candidates:
                break
            locked = list(
                Workflow.objects.select_for_update(skip_locked=skip_locked)
                .filter(id__in=candidates)
                .values_list("id", flat=True)
            )
            # Read again under the run locks: a run may wait anew, for a later time, since.
            due = set(
                Wait.objects.select_for_update()
                .filter(run_id__in=locked, wake_at__lte=now)
                .values_list("run_id", flat=True)
            )
            if due:
                # The fence: only a run still waiting wakes (a stray row of any
                # other run is deleted below and wakes nothing).
                woken += Workflow.objects.filter(id__in=due, status=Status.WAITING).update(
                    status=Status.SCHEDULED
                )
                Wait.objects.filter(run_id__in=due).delete()
                notify_scheduled()
        if len(candidates) < batch:
            break
    return woken, _next_wake_at()


def _next_wake_at() -> dt.datetime | None:
    """The earliest wake time of any wait (None: no run waits for a time)."""
    from .models import Wait

    return Wait.objects.aggregate(at=Min("wake_at"))["at"]


def _due_candidates(now: dt.datetime, batch: int) -> list:
    """Runs whose wait looked due, read without a lock: by the time they are
    locked, one may have been woken and be waiting anew (so wake_due reads again)."""
    from .models import Wait

    due = Wait.objects.filter(wake_at__lte=now).order_by("wake_at")
    return list(due.values_list("run_id", flat=True)[:batch])


# ---------------------------------------------------------------- from anywhere


def send_event(run_id, key: str, value: Any = None) -> bool:
    """Send the event ``key`` with ``value`` to run ``run_id``, inside the
    caller's transaction (rolled back with it), and wake the run if it waits
    for it. Idempotent per key: the first value sent for a key is kept and a
    later send returns False; True when this call stored it.

    An event sent before the run waits for it is kept until it does.
    Refuses (:class:`~everystep.errors.EverystepError`) a malformed key, a
    value that does not serialize, a value the database refuses
    (:class:`~everystep.errors.RefusedByDatabase`) and a run that does not exist.
    """
    from .models import Event, Workflow
    from .operations import parse_run_id

    _check_key(key)
    try:
        serde.encode(value)
    except EverystepError as exc:
        raise EverystepError(f"event {key!r}: the value is not serializable: {exc}") from None
    run_id = parse_run_id(run_id)
    with database.atomic():
        # The run row first, as every wait transition: a suspension racing this
        # send commits before or after it, never unseen by both.
        locked = Workflow.objects.select_for_update().filter(id=run_id)
        workflow = locked.values_list("name", flat=True).first()
        if workflow is None:
            raise EverystepError(f"run {run_id} does not exist")
        try:
            with database.atomic():  # a savepoint: a duplicate keeps the caller's transaction
                Event.objects.create(run_id=run_id, key=key, value=value)
            stored = True
        except IntegrityError as exc:
            # A duplicate only if the key's event is there: MariaDB's JSON check
            # also refuses a value (nested past 32 levels), and that send stored
            # nothing and must wake nothing.
            if not Event.objects.filter(run_id=run_id, key=key).exists():
                raise RefusedByDatabase(
                    f"event {key!r}: the database refused the value, nothing was stored: {exc}"
                ) from None
            stored = False
        else:
            transaction.on_commit(lambda: observability.event_sent(workflow), using=database.alias())
        wake(run_id, kind="event", key=key)
    return stored


def is_wait_step(name: str) -> bool:
    """Whether a step row of this name is a wait: its ``started`` row means
    "waiting here", not an unsafe step's uncertain outcome."""
    return name in WAIT_STEP_NAMES


def _check_key(key) -> None:
    if not isinstance(key, str) or not key:
        raise EverystepError(f"an event key must be a non-empty string, got {key!r}")
    if len(key) > MAX_KEY_LENGTH:
        raise EverystepError(
            f"event key {key[:40]!r}... is {len(key)} characters; the limit is {MAX_KEY_LENGTH}"
        )
    serde.check_text("event key", key)


def _seconds(duration) -> float:
    if isinstance(duration, dt.timedelta):
        seconds = duration.total_seconds()
    elif isinstance(duration, int | float) and not isinstance(duration, bool):
        try:
            seconds = float(duration)
        except OverflowError:  # an int beyond a float (its repr shortened: it may be 400 digits)
            raise EverystepError(f"a duration of {reprlib.repr(duration)} seconds is too large") from None
    else:
        raise EverystepError(f"a duration is seconds (int or float) or a timedelta, got {duration!r}")
    if not math.isfinite(seconds):  # NaN or infinite: no wake time (no timeout is timeout=None)
        raise EverystepError(f"a duration must be a finite number of seconds, got {duration!r}")
    if seconds < 0:
        raise EverystepError(f"a duration must not be negative, got {duration!r}")
    return seconds


def _after(seconds: float, duration) -> dt.datetime:
    """The wake time ``seconds`` from now; a duration too large for a
    ``timedelta`` or a wake time after the year 9999 (``timedelta.max``) is
    refused here, not left to fail the run with a bare OverflowError."""
    try:
        return timezone.now() + dt.timedelta(seconds=seconds)
    except OverflowError:
        raise EverystepError(
            f"a duration of {duration!r} is too large: its wake time would be after the year 9999"
        ) from None
