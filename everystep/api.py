"""The public API: thin wrappers that delegate to the registry, runner and models."""

import functools
import inspect
from collections.abc import Callable
from typing import Any

from . import limits, registry, runner, serde
from .context import current
from .errors import EverystepError, Terminal

__all__ = ["workflow", "step", "parallel", "schedule", "start_child", "Terminal"]

# The length of the name columns (``everystep_workflow.name``, ``everystep_step.name``).
MAX_NAME_LENGTH = 300


def workflow(
    func: Callable | None = None,
    *,
    cron: str | None = None,
    timezone: str = "UTC",
    max_concurrent: int | None = None,
):
    """Mark ``func`` as a workflow: a function that :func:`schedule` can run durably.

    Use as ``@workflow``, or ``@workflow(cron="0 9 * * MON-FRI")`` to have the
    workers start it on a schedule: once per slot (a time the expression
    matches in ``timezone``, UTC by default), with the slot's time as its one
    argument, however many workers run (see :doc:`/schedules`). A bad
    expression, an unknown zone or a function that cannot take the slot
    raises :class:`~everystep.cron.ScheduleError` here, at import.

    ``max_concurrent=N`` (a positive integer) caps the runs of this workflow
    that are ``running`` at once across all workers: a claim takes one of its
    runs only while fewer than N are (see :ref:`concurrency-limits`). Its
    other runs wait ``scheduled``, and the workers claim other workflows'
    runs meanwhile. Anything but a positive integer (at most 2**31 - 1, what
    the database stores) raises :class:`~everystep.errors.EverystepError`
    here, at import.

    The workflow is registered under its qualified name ``module.qualname``,
    which is what a run row stores: renaming or moving the function changes
    its identity, and two workflows must not share one (the last registered
    replaces the first: a decorator applied under ``@workflow`` must use
    ``functools.wraps``, or every function it wraps is named ``wrapper``).
    A name longer than 300 characters (the column) raises
    :class:`~everystep.errors.EverystepError` here, at import. Workers and
    the UI import every installed app's ``workflows`` module at start-up, so
    define workflows there (or in a module it imports).

    On every claim the body runs again from the top and recorded steps are
    served from the store, so code between steps must be deterministic. A
    step, wait, ``parallel`` or ``start_child`` called in the body inside a
    ``transaction.atomic()`` on everystep's database fails the run with an
    ``EverystepError``: its record would be rolled back with that transaction
    (see :ref:`transactions-in-a-workflows-body`). Its
    arguments and return value go through :mod:`everystep.serde`. Outside a
    run, calling the function is a plain call.
    """

    def decorate(func: Callable) -> Callable:
        name = _checked_name(func, "workflow")
        schedule = None
        if cron is not None:
            from . import cron as crons  # cronsim is imported only by a project that declares a schedule

            schedule = crons.declare(name, func, cron, timezone)
        elif timezone != "UTC":
            raise EverystepError(
                f"workflow {name}: timezone={timezone!r} is the zone of a cron schedule; add cron=..."
            )
        spec = registry.Spec(
            name, func, "workflow", cron=schedule, max_concurrent=limits.checked(name, max_concurrent)
        )
        registry.register(spec)

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            return func(*args, **kwargs)

        wrapper.__everystep__ = spec
        return wrapper

    return decorate(func) if func is not None else decorate


def step(func: Callable | None = None, *, unsafe_to_repeat: bool = False):
    """Mark a function as a step: its outcome is recorded once per run, and replay
    serves it from the store instead of calling the function again.

    Use as ``@step`` or ``@step(unsafe_to_repeat=True)``. Steps are at least
    once: a crash after the function returned but before its row was written
    runs it again on resume. ``unsafe_to_repeat=True`` writes a ``started``
    row before the function runs, so that an outcome lost to a crash parks
    the run ``blocked`` for an operator instead of running the effect twice.

    A caller may pass ``everystep_id="name"`` to name the call instead of
    numbering it (a non-empty string without ``.``, not all digits, unique
    in its scope; of a ``(str, Enum)`` member, pass ``.value``: the id is
    made as an f-string makes it, ``Name.MEMBER``, and runs in flight
    recorded it so). Arguments and the result must be serializable by
    :mod:`everystep.serde`; a stored failure is raised again on replay.
    Outside a run, or inside another step's function, calling a step is a
    plain call. The qualified name is limited to 300 characters, as for
    :func:`workflow`.
    """

    if not isinstance(unsafe_to_repeat, bool):  # "false" read from configuration is true
        raise TypeError(f"@step(unsafe_to_repeat=...) takes True or False, not {unsafe_to_repeat!r}")

    def decorate(func: Callable) -> Callable:
        spec = registry.Spec(_checked_name(func, "step"), func, "step", unsafe_to_repeat)
        registry.register(spec)

        @functools.wraps(func)
        def wrapper(*args, everystep_id: str | None = None, **kwargs):
            return runner.call_step(spec, args, kwargs, everystep_id)

        wrapper.__everystep__ = spec
        return wrapper

    return decorate(func) if func is not None else decorate


def _checked_name(func: Callable, kind: str) -> str:
    """The qualified name a run or step row stores, refused here, at import,
    when longer than its column: PostgreSQL and MariaDB would refuse it only at
    the write (SQLite stores it), so it is refused on every backend. So is
    what the engine cannot call for a result: not a function (``@workflow("0 9
    * * *")``, an option passed without its keyword), or an ``async def`` or
    generator function, whose call returns a coroutine or generator unrun."""
    if not callable(func) or not hasattr(func, "__qualname__"):
        raise TypeError(
            f"@{kind} decorates a function defined with def, not {func!r}; its options go by "
            f'keyword (@workflow(cron="0 9 * * *"), @step(unsafe_to_repeat=True))'
        )
    name = registry.qualified_name(func)
    unrun = (inspect.iscoroutinefunction, inspect.isasyncgenfunction, inspect.isgeneratorfunction)
    if any(returns_unrun(func) for returns_unrun in unrun):
        raise EverystepError(
            f"{kind} {name}: an async def or generator function cannot be a {kind}: calling it returns "
            "a coroutine or generator, not its result. Use a plain def (run async code with "
            "asyncio.run() inside a step)."
        )
    if len(name) > MAX_NAME_LENGTH:
        raise EverystepError(
            f"{kind} {name}: the qualified name (module.qualname) is {len(name)} characters; the "
            f"limit is {MAX_NAME_LENGTH}, the length of the name column. Use a shorter function "
            "or module name."
        )
    return name


def parallel(*branches, everystep_id: str | None = None) -> tuple:
    """Run branches concurrently and return their results in branch order.

    A branch is a zero-argument callable or a list of them run in order on one
    thread (its result is a tuple). Each branch runs on its own thread, in a
    scope of its own: branch ``i`` of fork ``3`` numbers its steps ``3.i.1``,
    ``3.i.2``... ``everystep_id`` names the fork as it names a step.

    One failure is raised as is, several as an ``ExceptionGroup``; a
    :class:`Terminal` (or an uncertain effect, or a drain) in any branch wins
    over both. Healthy branches run to completion and are recorded even when
    a sibling fails. Outside a run the branches still run concurrently, as
    plain calls.
    """
    ctx = current()
    if ctx is not None and ctx.running_step is None and ctx.connection.in_atomic_block:
        ctx.refuse_transaction("parallel()")
    return runner.run_parallel(branches, everystep_id)


def start_child(workflow_func: Callable, *args: Any, everystep_id: str | None = None):
    """Start ``workflow_func(*args)`` as a child run of the running workflow and
    return its :class:`~everystep.children.ChildHandle` (``handle.id`` is the
    child's run id).

    Call it from a workflow's body: it is recorded like a step (numbered, or
    named by ``everystep_id``), so a replay returns the same child and never
    starts a second one, also after a crash between the child's insert and
    the record. The child runs on its own, claimed by any worker; the run
    pages link parent and children (see :doc:`/children`). Refuses, before
    writing anything, what ``schedule`` refuses, and a call outside a run or
    inside a step's function (:class:`~everystep.errors.EverystepError`).
    """
    spec = _workflow_spec(workflow_func, "start_child")
    _check_args(spec, args)
    return runner.start_child(spec, args, everystep_id)


def _workflow_spec(workflow_func: Callable, caller: str) -> registry.Spec:
    spec = getattr(workflow_func, "__everystep__", None)
    if spec is None or spec.kind != "workflow":
        raise TypeError(f"{caller}() needs a @workflow function, got {workflow_func!r}")
    return spec


def _check_args(spec: registry.Spec, args: tuple) -> None:
    try:
        inspect.signature(spec.func).bind(*args)
    except TypeError as exc:
        raise TypeError(f"arguments do not fit workflow {spec.name}: {exc}") from None
    try:
        serde.encode(list(args))
    except EverystepError as exc:
        raise EverystepError(
            f"workflow {spec.name}: arguments are not serializable: {exc}"
        ) from None


def schedule(workflow_func: Callable, *args: Any, idempotency_key: str | None = None):
    """Insert a ``scheduled`` run inside the caller's transaction and return its row.

    The run is rolled back with the transaction, and claimable once it
    commits. Returns the :class:`~everystep.models.Workflow` row (its ``id``
    is the run id). With ``idempotency_key`` (a non-empty string of at most
    255 characters), a second call with the same workflow and key returns
    the existing row instead, also when two callers race.

    Refuses before writing anything: a function that is not a
    :func:`workflow` and arguments that do not fit its signature
    (``TypeError``), arguments that do not serialize, a malformed key, and a
    call in a workflow's body without ``idempotency_key``, which every replay
    would repeat (:class:`~everystep.errors.EverystepError`; use
    :func:`start_child` there).
    """
    from .models import Workflow  # not at import time: settings may import this module
    from .scheduling import insert_run, refuse_in_a_body

    spec = _workflow_spec(workflow_func, "schedule")
    _check_args(spec, args)
    if idempotency_key is None:  # with a key, a replay finds the same run
        refuse_in_a_body(
            f"schedule({spec.name})",
            "Use start_child() (a child run, recorded like a step), or call schedule() inside a step "
            "with an idempotency_key.",
        )
    if idempotency_key is not None and not (isinstance(idempotency_key, str) and idempotency_key):
        raise EverystepError(f"idempotency_key must be a non-empty string, got {idempotency_key!r}")
    if idempotency_key is not None and len(idempotency_key) > 255:
        raise EverystepError("idempotency_key is longer than 255 characters")
    if idempotency_key is not None:
        # NUL or a lone surrogate: PostgreSQL refuses it (a raw DataError),
        # encoding it fails everywhere, and SQLite/MariaDB would store a key
        # PostgreSQL cannot hold. A malformed key, refused before any write.
        serde.check_text("the idempotency key", idempotency_key)
    return insert_run(Workflow, spec.name, list(args), idempotency_key)
