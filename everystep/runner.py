"""Executes one claimed run by replaying its body from the top.

Invariants (what a crash at any line leaves behind):
- a step's row is written only after its function returned or raised, in its
  own autocommit statement, so a crash before that leaves the step unrecorded
  and it runs again on the next claim (at-least-once);
- an unsafe-to-repeat step inserts a ``started`` row before its function runs,
  so a crash in between leaves ``started``, and the next claim blocks the run
  instead of repeating the effect;
- every write is fenced on the run still being ``running`` under this worker's
  name: once an operator stopped or requeued the run, or another worker took it,
  this worker writes nothing more;
- the run's end is one guarded UPDATE; a crash before it leaves the run
  ``running`` under this worker's name, which re-claims it at start-up.
"""

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DatabaseError, IntegrityError, InterfaceError, OperationalError
from django.db import connections as db_connections

from . import children, database, observability, registry, serde, statements
from .context import Context, Outcome, RunState, activate, current
from .errors import (
    DrainOrphan,
    EffectUncertain,
    EverystepError,
    Fenced,
    RefusedByDatabase,
    SimulatedCrash,
    Suspended,
    Terminal,
    WorkflowCodeError,
)
from .statuses import RunStatus as Status
from .statuses import StepStatus

logger = logging.getLogger("everystep")

# Test hook: ``fault(ctx, step_id)`` runs after a step's function and before its
# outcome is written. Raising SimulatedCrash there ends the run as a process death would.
fault: Callable | None = None

# Metrics, Sentry and trace hooks (everystep.observability), or None when no
# observability extra is importable: an executed step then costs one check.
observer = observability.observer


# ---------------------------------------------------------------- running a run


def execute(
    run,
    claimer: str,
    *,
    leave_check: Callable | None = None,
    watch: Callable | None = None,
    finish: Callable | None = None,
) -> str | None:
    """Replay ``run`` (claimed by ``claimer``) and record how it ended.

    Returns the status written, or ``None`` when nothing was written (a
    simulated crash, or the run no longer belongs to this worker).
    ``leave_check()`` is asked at every step boundary; returning a
    ``DrainOrphan`` makes the run leave this worker there. ``watch(state)`` is
    called with the run's :class:`RunState` before the body starts (the
    worker's heartbeat reads its executing steps). ``finish`` ends the run in
    place of ``operations.finish_run``, with the same arguments and result
    (a child's end stays its own): the worker's next claim goes with it.
    """
    if observer is not None:
        return observer.run(run, claimer, _replay, leave_check, watch, finish)
    return _replay(run, claimer, leave_check, watch, finish)


def _replay(
    run,
    claimer: str,
    leave_check: Callable | None,
    watch: Callable | None = None,
    finish: Callable | None = None,
) -> str | None:
    spec = registry.get_workflow(run.name)
    if spec is None:
        failure = registry.import_failure(run.name)
        if failure is not None:
            # Its module raised on import: that error is the cause, not a rename.
            error = {**serde.encode_exception(failure.exception), "where": failure.where}
            return _end(run, claimer, Status.FAILED, exc=failure.exception, error=error, finish=finish)
        error = EverystepError(
            f"run {run.id}: no @workflow is registered as {run.name!r} (was it renamed or "
            "removed?). Deploy the code that defines it, then retry the run."
        )
        return _end(run, claimer, Status.FAILED, exc=error, finish=finish)
    unreadable = getattr(run, "unreadable_args", None)  # set by a claim (everystep.claims)
    if unreadable is not None:
        error = EverystepError(
            f"run {run.id}: its stored arguments cannot be read: {unreadable}. Something they "
            "name (a class, an enum member) changed or was removed since the run was scheduled. "
            "Deploy code that reads them, then retry the run."
        )
        return _end(run, claimer, Status.FAILED, exc=error, finish=finish)
    state = RunState(run.id, run.name, claimer, leave_check)
    # Read once per run, not per step: settings lookups are not free.
    state.database = database.alias()
    state.prepared_statements = statements.prepared_statements()
    # A claim says whether the run has recorded steps (``has_steps``); a run
    # from elsewhere (the ORM, a claim that cannot tell) is loaded.
    try:
        state.store = _load_outcomes(run.id) if getattr(run, "has_steps", True) else {}
    except EverystepError as exc:  # ended here, as unreadable arguments are, for the observers to see
        error = EverystepError(
            f"run {run.id}: a recorded step's result or error cannot be read: {exc}. Something it "
            "names (a class, an enum member) changed or was removed since the step ran. Deploy code "
            "that reads it, then retry the run."
        )
        return _end(run, claimer, Status.FAILED, exc=error, finish=finish)
    state.halt = _recorded_terminal(state.store)
    if watch is not None:
        watch(state)
    value, raised = None, None
    try:
        with activate(Context(state)):
            value = spec.func(*run.args)
    except Exception as exc:
        raised = exc
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:  # CancelledError, SystemExit from the body's code: its failure
        raised = exc
    outcome = state.halt or raised
    return _conclude(run, state, value, outcome, finish)


def _load_outcomes(run_id) -> dict[str, Outcome]:
    return {
        step_id: Outcome(status, name, result, error)
        for step_id, status, name, result, error in statements.load_outcomes(run_id)
    }


def _recorded_terminal(store: dict[str, Outcome]) -> Terminal | None:
    """A ``Terminal`` an earlier pass recorded, to halt this replay with before
    the body starts: that pass started no step after it, and in a ``parallel``
    a sibling branch replaying ahead of the Terminal's branch must not start
    one either (a wait woken meanwhile, a crash before the run's end). One pass
    over the loaded outcomes per run, no query."""
    for outcome in store.values():
        if outcome.status == StepStatus.FAILED:
            exc = outcome.exception()
            if isinstance(exc, Terminal):
                return exc
    return None


def _conclude(run, state: RunState, value, outcome, finish: Callable | None) -> str | None:
    from . import operations
    if isinstance(outcome, SimulatedCrash):
        return None
    if isinstance(outcome, Fenced):
        # Still ours, the write that fenced us out was an earlier claim's that
        # landed after this claim read the run's rows: a replay serves it. Left
        # running here, nothing would ever end the run. Not ours: this matches nothing.
        if database.reconnecting(operations.release_run, run.id, state.claimer):
            logger.warning("run %s: %s; requeued, for a replay that serves it", run.id, outcome)
            observability.requeued(state.claimer, 1)
            return Status.SCHEDULED
        logger.warning("run %s: %s; leaving it as it is", run.id, outcome)
        return None
    if isinstance(outcome, Suspended):
        from . import waits

        # Every wait the run stops at, not only the first one (outcome.waiting):
        # in a parallel fork each branch's wait needs its own row, or its wake
        # time (a timeout) and its event key would not wake the run.
        waiting = database.reconnecting(waits.stopped_at, state)
        status = database.reconnecting(waits.suspend_run, run.id, state.claimer, *waiting)
        if status == Status.WAITING:
            observability.suspended(run.name, outcome.waiting.kind, state.claimer)
        # SCHEDULED: a wait was over already, so the run is back in the queue at
        # once. Neither a suspension nor a requeue: it counts as neither.
        return status
    if isinstance(outcome, DrainOrphan):
        database.reconnecting(operations.release_run, run.id, state.claimer)
        observability.requeued(state.claimer, 1)
        return Status.SCHEDULED
    if state.engine_error is not None and isinstance(outcome, OperationalError | InterfaceError):
        # The database went away mid-record: the run is fine, its record is not.
        # Put it back so that a replay (here or elsewhere) finishes it.
        logger.warning("run %s: database error while recording (%s); requeueing", run.id, outcome)
        database.reconnecting(operations.release_run, run.id, state.claimer)
        observability.requeued(state.claimer, 1)
        return Status.SCHEDULED
    if isinstance(outcome, Terminal):
        return _end(run, state.claimer, Status.STOPPED, exc=outcome, finish=finish)
    if isinstance(outcome, EffectUncertain):
        return _end(run, state.claimer, Status.BLOCKED, exc=outcome, finish=finish)
    if outcome is not None:
        if state.engine_error is not None:
            logger.error("run %s: engine error while recording: %r", run.id, outcome)
        return _end(run, state.claimer, Status.FAILED, exc=outcome, finish=finish)
    try:
        serde.encode(value)
    except EverystepError as exc:
        error = EverystepError(
            f"run {run.id}: the workflow's return value is not serializable: {exc}"
        )
        return _end(run, state.claimer, Status.FAILED, exc=error, finish=finish)
    return _end(run, state.claimer, Status.COMPLETED, result=value, finish=finish)


def _end(
    run,
    claimer,
    status,
    *,
    result=None,
    exc: BaseException | None = None,
    error: dict | None = None,
    finish: Callable | None = None,
) -> str | None:
    """End the run; ``error`` is the stored form of ``exc`` when it needs more than its encoding."""

    if error is None and exc is not None:
        error = serde.encode_exception(exc)
    # A child's end also wakes its waiting parent; only a child pays for that.
    ending = children.finisher(run, finish)
    if database.reconnecting(ending, run.id, claimer, status, result=result, error=error):
        if status == Status.FAILED and observer is not None:
            observer.run_failed(run, claimer, exc)  # once: only one guarded update matches
        return status
    logger.warning(
        "run %s is no longer running under %r; its end (%s) was not recorded",
        run.id,
        claimer,
        status,
    )
    return None


# ---------------------------------------------------------------- steps


def call_step(spec: registry.Spec, args: tuple, kwargs: dict, everystep_id: str | None) -> Any:
    """A step call, as a pipeline: identify the call; serve it from the store
    when recorded; else encode its arguments, claim its effect (unsafe steps),
    execute it, pass the fault hook, and record its outcome."""
    ctx = current()
    if ctx is None or ctx.running_step is not None:
        return spec.func(*args, **kwargs)  # outside a run, or nested inside a step
    if ctx.connection.in_atomic_block:
        ctx.refuse_transaction(f"step {spec.name}")
    state = ctx.state
    state.check()
    step_id = ctx.next_id(everystep_id)
    recorded = state.store.get(step_id)
    if recorded is not None:
        _check_same_function(state, step_id, spec, recorded)
        if recorded.status != StepStatus.STARTED:
            return _serve_recorded(recorded)
    row = _StepRow(state, step_id, spec, args, kwargs, started=recorded is not None)
    if spec.unsafe_to_repeat:
        _claim_effect(row)
    result, raised = _run_function(ctx, row, args, kwargs)
    return _record_outcome(row, result, raised)


def _check_same_function(state: RunState, step_id: str, spec: registry.Spec, recorded: Outcome) -> None:
    """Divergence: the code calls another function where the run recorded this one."""
    if recorded.name != spec.name:
        state.halt_with(
            WorkflowCodeError(
                f"run {state.workflow_id}: step {step_id} was recorded as {recorded.name} but the "
                f"code now calls {spec.name} there. The workflow's code changed under a running "
                "run: deploy the old code to finish it, or stop it."
            )
        )


def _serve_recorded(recorded: Outcome) -> Any:
    """A recorded outcome, served as the first pass saw it: the result, or the
    exception raised again. (A recorded ``Terminal`` is never served: the replay
    halted with it before the body started, see _recorded_terminal.)"""
    if recorded.status == StepStatus.DONE:
        return recorded.result
    raise recorded.exception()


class _StepRow:
    """The step being recorded: its identity and its arguments, already encoded.
    ``in_place``: a ``started`` row of it exists (left by an earlier pass, or
    written by the effect claim), so its outcome completes that row."""

    __slots__ = ("state", "step_id", "spec", "args", "kwargs", "in_place")

    def __init__(self, state: RunState, step_id: str, spec: registry.Spec, args, kwargs, *, started: bool):
        try:
            self.args, self.kwargs = serde.encode(list(args)), serde.encode(kwargs)
        except EverystepError as exc:
            raise EverystepError(
                f"run {state.workflow_id}, step {step_id} ({spec.name}): arguments are not "
                f"serializable, the step did not run: {exc}"
            ) from None
        self.state, self.step_id, self.spec = state, step_id, spec
        self.in_place = started


def _claim_effect(row: _StepRow) -> None:
    """An unsafe-to-repeat step's effect runs at most once. A ``started`` row
    left by an earlier pass means its outcome is unknown: block the run.
    Otherwise insert the ``started`` row, an atomic claim on the effect: when
    the insert conflicts, another pass got there first, and the run blocks."""
    state = row.state
    if row.in_place:
        state.halt_with(_uncertain(state, row.step_id, row.spec))
    try:
        _guarded_db(state, _insert, row, StepStatus.STARTED)
    except IntegrityError as exc:
        refused = _refused(row, exc, "so the step did not run")
        if refused is not None:
            raise refused from None
        state.halt_with(_uncertain(state, row.step_id, row.spec))
    row.in_place = True
    state.store[row.step_id] = Outcome(StepStatus.STARTED, row.spec.name)


def _uncertain(state: RunState, step_id: str, spec: registry.Spec) -> EffectUncertain:
    return EffectUncertain(
        f"run {state.workflow_id}: unsafe-to-repeat step {step_id} ({spec.name}) started but "
        "its outcome was never recorded, so its effect may or may not have happened. Check the "
        "effect, then resolve: python manage.py everystep_resolve_step "
        f"{state.workflow_id} {step_id} (--result JSON | --error MESSAGE | --discard)"
    )


def _run_function(ctx: Context, row: _StepRow, args: tuple, kwargs: dict) -> tuple[Any, BaseException | None]:
    """Run the step's function: ``(result, None)`` or ``(None, exception)``.
    Then the fault hook, between the effect and its record. A BaseException
    raised by the step's code (``asyncio.CancelledError``, ``SystemExit``) is
    its failure like any other; ``KeyboardInterrupt`` and ``GeneratorExit``
    go through unrecorded."""
    ctx.running_step = row.step_id
    try:
        if observer is None:
            result, raised = row.spec.func(*args, **kwargs), None
        else:
            result, raised = observer.step(ctx.state, row.step_id, row.spec, args, kwargs), None
    except Exception as exc:
        result, raised = None, exc
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:
        result, raised = None, exc
    ctx.running_step = None
    _fault(ctx, row.step_id)
    return result, raised


def _fault(ctx: Context, step_id: str) -> None:
    if fault is not None:
        try:
            fault(ctx, step_id)
        except SimulatedCrash as crash:
            ctx.state.halt_with(crash)


def _record_outcome(row: _StepRow, result: Any, raised: Exception | None) -> Any:
    """Record the outcome, then return the result or raise the exception as the
    function did. A ``Terminal`` halts the run: no further step starts."""
    state = row.state
    if raised is not None:
        _record(row, StepStatus.FAILED, error=serde.encode_exception(raised))
        if isinstance(raised, Terminal):
            state.halt_with(raised)
        raise raised
    try:
        stored_result = serde.encode(result)
    except EverystepError as exc:
        raise EverystepError(
            f"run {state.workflow_id}, step {row.step_id} ({row.spec.name}): the return value is not "
            f"serializable, so it was not recorded and the step runs again on resume: {exc}"
        ) from None
    _record(row, StepStatus.DONE, result=result, stored_result=stored_result)
    return result


def _record(row: _StepRow, status: str, *, result=None, stored_result=None, error=None) -> None:
    state = row.state
    if row.in_place:
        _guarded_db(state, _complete_started, row, status, result, error)
    else:
        try:
            stored_error = None if error is None else serde.encode(error)
            _guarded_db(state, _insert, row, status, stored_result, stored_error)
        except IntegrityError as exc:
            refused = _refused(row, exc, "so it was not recorded and the step runs again on resume")
            if refused is not None:
                raise refused from None
            state.halt_with(
                Fenced(
                    f"step {row.step_id} of run {state.workflow_id} was recorded "
                    "meanwhile by another worker"
                )
            )
    state.store[row.step_id] = Outcome(status, row.spec.name, result, error)


def _refused(row: _StepRow, exc: IntegrityError, consequence: str) -> RefusedByDatabase | None:
    """None when the step's insert lost on its unique key: another pass wrote
    the row. Otherwise the database refused a value in it (MariaDB's JSON
    check refuses nesting past 32 levels), and taking that for a lost race
    would run the step again at every replay: the error for the body."""
    from .models import Step

    if Step.objects.filter(workflow_id=row.state.workflow_id, step_id=row.step_id).exists():
        return None
    return RefusedByDatabase(
        f"run {row.state.workflow_id}, step {row.step_id} ({row.spec.name}): the database refused "
        f"its record, {consequence}: {exc}"
    )


def _insert(row: _StepRow, status: str, stored_result=None, stored_error=None) -> None:
    """One statement records the step and fences it on the run's owner."""
    state = row.state
    recorded = statements.insert_step(
        state.connection(),
        state.workflow_id,
        state.claimer,
        row.step_id,
        row.spec.name,
        status,
        args=row.args,
        kwargs=row.kwargs,
        result=stored_result,
        error=stored_error,
        prepared=state.prepared_statements,
        run_text=state.workflow_text,
    )
    if not recorded:
        state.halt_with(
            Fenced(
                f"run {state.workflow_id} is no longer running under "
                f"{state.claimer!r}; step {row.step_id} was not recorded"
            )
        )


def _complete_started(row: _StepRow, status, result, error) -> None:
    from .models import Step, running_under

    state = row.state
    updated = Step.objects.filter(
        running_under(state.claimer, run="workflow__"),
        workflow_id=state.workflow_id,
        step_id=row.step_id,
        status=StepStatus.STARTED,
    ).update(status=status, result=result, error=error)
    if not updated:
        state.halt_with(
            Fenced(
                f"run {state.workflow_id} is no longer running under "
                f"{state.claimer!r}; step {row.step_id} was not completed"
            )
        )


def _guarded_db(state: RunState, func, *args):
    """Run an engine write; a database error halts the run as an engine error."""
    try:
        return func(*args)
    except IntegrityError:
        raise
    except DatabaseError as exc:
        state.engine_error = exc
        state.halt_with(exc)


# ---------------------------------------------------------------- child runs


def start_child(spec: registry.Spec, args: tuple, everystep_id: str | None) -> children.ChildHandle:
    """Start a child run, recorded like a step: its row (``done``, the child's
    run id) is served on replay. The child is inserted and linked in one
    fenced transaction under a key derived from this call, then the fault hook
    runs, then the row is written: a crash in between finds the same child."""
    ctx = current()
    children.check_inside_body(ctx, spec.name)
    state = ctx.state
    state.check()
    step_id = ctx.next_id(everystep_id)
    recorded = state.store.get(step_id)
    if recorded is not None:
        _check_same_function(state, step_id, spec, recorded)
        return children.ChildHandle(_serve_recorded(recorded), spec.name)
    row = _StepRow(state, step_id, spec, args, {}, started=False)
    started = _guarded_db(
        state, children.insert_child, state.workflow_id, state.claimer, step_id, spec.name, list(args)
    )
    if started is None:
        state.halt_with(
            Fenced(
                f"run {state.workflow_id} is no longer running under "
                f"{state.claimer!r}; its child at step {step_id} was not started"
            )
        )
    child_id, inserted = started
    if inserted:
        observability.child_started(state.name, spec.name, state.claimer, step_id, child_id)
    _fault(ctx, step_id)
    _record(row, StepStatus.DONE, result=child_id, stored_result=serde.encode(child_id))
    return children.ChildHandle(child_id, spec.name)


# ---------------------------------------------------------------- parallel


def run_parallel(branches: Sequence, everystep_id: str | None) -> tuple:
    callables = [_as_callable(branch, i) for i, branch in enumerate(branches)]
    ctx = current()
    if ctx is None or ctx.running_step is not None:
        return _gather(callables, [None] * len(callables), None)
    ctx.state.check()
    fork_id = ctx.next_id(everystep_id)
    children = [ctx.child(f"{fork_id}.{i}.") for i in range(len(callables))]
    if observer is not None:
        with observer.fork(ctx.state, fork_id) as wrap_branch:
            return _gather(callables, children, ctx.state, wrap_branch)
    return _gather(callables, children, ctx.state)


def _as_callable(branch, index: int) -> Callable:
    if isinstance(branch, list | tuple):
        if not all(callable(item) for item in branch):
            raise TypeError(f"parallel branch {index}: a sequence branch must hold only callables")
        items = list(branch)
        return lambda: tuple(item() for item in items)
    if not callable(branch):
        raise TypeError(
            f"parallel branch {index} is a {type(branch).__name__}; pass a zero-argument callable "
            "(e.g. lambda: my_step(x)) or a list of them"
        )
    return branch


def _gather(callables, contexts, state: RunState | None, wrap_branch: Callable | None = None) -> tuple:
    results: list[Any] = [None] * len(callables)
    errors: list[BaseException | None] = [None] * len(callables)

    def run_branch(i):
        try:
            with activate(contexts[i]):
                results[i] = callables[i]()
        except BaseException as exc:  # reported to the caller below
            errors[i] = exc
        finally:
            db_connections.close_all()  # this thread's connections only

    # wrap_branch carries the trace context into the branch thread.
    target = run_branch if wrap_branch is None else wrap_branch(run_branch)
    threads = [
        threading.Thread(target=target, args=(i,), name=f"everystep-branch-{i}")
        for i in range(len(callables))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if state is not None and state.halt is not None:
        raise state.halt
    failed = [exc for exc in errors if exc is not None]
    if not failed:
        return tuple(results)
    for exc in failed:
        if isinstance(exc, Terminal | DrainOrphan | EffectUncertain | SimulatedCrash | Suspended):
            raise exc
    if len(failed) == 1:
        raise failed[0]
    raise BaseExceptionGroup(f"{len(failed)} parallel branches failed", failed)
