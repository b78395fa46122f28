"""A backend for Django's Tasks framework (``django.tasks``, Django 6.0 and later)
that makes every enqueued task a durable everystep run.

    TASKS = {"default": {"BACKEND": "everystep.tasks.EverystepBackend"}}

``.enqueue(*args, **kwargs)`` inserts one ``scheduled`` run, the one write
``schedule()`` makes, on everystep's database and inside the caller's
transaction when that transaction is on the same alias. The run's name is the
task's module path; its ``args`` is ``[args, kwargs]`` (so a run's args stay a
list passed positionally, to the adapter below). Any worker runs it: importing
the task's module creates the ``Task``, Django validates it with this backend,
and :meth:`EverystepBackend.validate_task` registers the adapter under the
task's name, as ``@workflow`` does at import. A task bound to another backend
and enqueued here through ``.using(backend=...)`` is validated by its own
backend at import: the registry's lookup registers its adapter instead
(:func:`register_task`).

The adapter first records a step, ``task:started``, whose value is the time
the run first started (``TaskResult.started_at``; the data model keeps no
claim time), then calls the task in a scope of its own, so a task's step ids
are those of its function alone. A failure keeps its formatted traceback in the
run's error (key ``traceback``), which ``TaskError.traceback`` reports.

Invariants: a crash at any line of a task leaves what a crash of a workflow
leaves (the run replays; recorded steps, ``task:started`` among them, are
served from the store). Enqueue writes one row or nothing.
"""

import contextlib
import inspect
import itertools
import sys
import traceback
import uuid

import django

try:
    from django.tasks import DEFAULT_TASK_QUEUE_NAME, TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskError
    from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued
except ImportError as exc:  # Django 5.2 has no django.tasks
    raise ImportError(
        f"everystep.tasks needs Django 6.0 or later (django.tasks); this is Django "
        f"{django.get_version()}. On Django 5.2, schedule @workflow functions instead."
    ) from exc

from django.core import checks
from django.db import connections
from django.utils import timezone

from . import registry, serde
from .api import step
from .context import Context, activate, current
from .errors import EverystepError
from .statuses import RunStatus

__all__ = ["EverystepBackend"]

STARTED_STEP_ID = "task:started"  # its row is not copied into a fork: everystep.history
MAX_NAME_LENGTH = 300  # everystep_workflow.name

# A run's status as django.tasks reports it. ``stopped`` (a Terminal, or an
# operator's stop) and ``blocked`` (an unsafe step's outcome unknown) ended
# without success: FAILED, with the cause in ``errors``. An operator's retry or
# resolve puts the run back to ``scheduled``, so READY again.
STATUSES = {
    RunStatus.SCHEDULED: TaskResultStatus.READY,
    RunStatus.RUNNING: TaskResultStatus.RUNNING,
    RunStatus.COMPLETED: TaskResultStatus.SUCCESSFUL,
    RunStatus.FAILED: TaskResultStatus.FAILED,
    RunStatus.STOPPED: TaskResultStatus.FAILED,
    RunStatus.BLOCKED: TaskResultStatus.FAILED,
    RunStatus.WAITING: TaskResultStatus.RUNNING,  # asleep or awaiting an event, mid-run
}


class EverystepBackend(BaseTaskBackend):
    # Durable timers are not there yet: a run is claimed as soon as it is committed.
    supports_defer = False
    # A coroutine runs through Task.call (async_to_sync) on the run's thread.
    supports_async_task = True
    supports_get_result = True
    # Runs are claimed oldest first, whatever their task.
    supports_priority = False

    def validate_task(self, task: Task) -> None:
        """Django's validation, one queue, and a name that is the function's own
        and fits a run's name.

        Django validates a ``Task`` as it is created, which is when its module is
        imported, in every process: the adapter is registered under the task's
        name then, so that a worker that imports the module can run it."""
        super().validate_task(task)
        if task.queue_name != DEFAULT_TASK_QUEUE_NAME:
            # everystep has one queue: every worker claims every run.
            raise InvalidTask(f"Queue '{task.queue_name}' is not valid for backend.")
        if not all(part.isidentifier() for part in task.module_path.split(".")):
            # A run names its task by module path: two module-level lambdas share
            # "module.<lambda>", and a worker would run whichever registered last.
            raise InvalidTask(
                f"Task function {task.module_path} has no name of its own to find it by: "
                "define it with def, at module level."
            )
        if len(task.module_path) > MAX_NAME_LENGTH:
            raise InvalidTask(
                f"Task module path {task.module_path[:60]}... is {len(task.module_path)} characters; "
                f"a run's name holds {MAX_NAME_LENGTH}."
            )
        registry.register(_adapter_spec(task))

    def enqueue(self, task: Task, args, kwargs) -> TaskResult:
        from .models import Workflow
        from .scheduling import insert_run, refuse_in_a_body

        self.validate_task(task)
        args, kwargs = list(args), dict(kwargs)
        _check_arguments(task, args, kwargs)
        refuse_in_a_body(
            f"enqueue() of the task {task.module_path}",
            "Enqueue it inside a step (or start a workflow with start_child(), recorded like a step).",
        )
        run = insert_run(Workflow, task.module_path, [args, kwargs], None)
        result = self._task_result(task, run, started_at=None)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id) -> TaskResult:
        from .claims import decode_stored, undecoded
        from .models import Step, Workflow

        try:
            run_id = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        # Decoded column by column, as a claim does: stored arguments or a result
        # that no longer decode (an enum renamed since) stay as stored, not raised.
        run = undecoded(Workflow.objects.filter(id=run_id)).first()
        if run is None:
            raise TaskResultDoesNotExist(result_id)
        decode_stored(run, connections[run._state.db])
        task = _task_named(run.name)
        if task is None:
            raise TaskResultDoesNotExist(
                f"{result_id} is a run of {run.name}, which is not a task this process can import"
            )
        if task.backend != self.alias:
            task = _bound_here(task, self.alias)
        started_at = (
            Step.objects.filter(workflow_id=run_id, step_id=STARTED_STEP_ID)
            .values_list("result", flat=True)
            .first()
        )
        return self._task_result(task, run, started_at=started_at)

    def check(self, **kwargs):
        yield from super().check(**kwargs)
        if self.queues != {DEFAULT_TASK_QUEUE_NAME}:
            yield checks.Error(
                f"TASKS[{self.alias!r}]['QUEUES'] is {sorted(self.queues)}, but everystep has one "
                "queue: every worker claims every run.",
                hint=f"Remove QUEUES, or set it to [{DEFAULT_TASK_QUEUE_NAME!r}].",
                id="everystep.E004",
            )

    def _task_result(self, task: Task, run, *, started_at) -> TaskResult:
        args, kwargs = run.args
        # Django requires JSON here: the stored (serde-encoded) form, which
        # arguments that no longer decode still are (claims.decode_stored).
        if getattr(run, "unreadable_args", None) is None:
            args, kwargs = serde.encode(args), serde.encode(kwargs)
        result = TaskResult(
            task=task,
            id=str(run.id),
            status=STATUSES[run.status],
            enqueued_at=run.created_at,
            started_at=started_at,
            finished_at=run.completed_at,
            last_attempted_at=None,  # not recorded: a run keeps no claim time
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[_task_error(run.error)] if run.error else [],
            # The worker that holds or last held the run: one claimer is recorded, not a history.
            worker_ids=[run.claimed_by] if run.claimed_by else [],
        )
        if run.status == RunStatus.COMPLETED:
            object.__setattr__(result, "_return_value", run.result)
        return result


def _check_arguments(task: Task, args: list, kwargs: dict) -> None:
    """Refuse, before anything is written, arguments the task cannot take or
    everystep cannot store."""
    leading = (None,) if task.takes_context else ()
    try:
        inspect.signature(task.func).bind(*leading, *args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"arguments do not fit task {task.module_path}: {exc}") from None
    for kind, value in (("positional", args), ("keyword", kwargs)):
        try:
            serde.encode(value)
        except EverystepError as exc:
            raise EverystepError(
                f"task {task.module_path}: {kind} arguments are not serializable, "
                f"nothing was enqueued: {exc}"
            ) from None


def _task_error(payload) -> TaskError:
    """A run's stored error as django.tasks reports it. Errors recorded outside
    the task body (an operator's stop, a missing task) carry no traceback: the
    exception's last line stands in for it."""
    if not isinstance(payload, dict):
        return TaskError(exception_class_path="", traceback=repr(payload))
    kind, message = str(payload.get("type", "")), str(payload.get("message", ""))
    formatted = payload.get("traceback")
    if not isinstance(formatted, str):
        formatted = f"{kind}: {message}\n" if message else f"{kind}\n"
    return TaskError(exception_class_path=kind, traceback=formatted)


def _task_named(name: str) -> Task | None:
    spec = registry.get_workflow(name)  # imports the task's module, which registers its tasks
    task = getattr(spec.func, "task", None) if spec is not None else None
    return task if isinstance(task, Task) else _find_task(name)


def _find_task(name: str) -> Task | None:
    """The ``Task`` whose module path is ``name``, in its module if that is
    imported (nothing is imported here). The path names the task's function:
    the ``Task`` itself when decorated, but the plain function when the task
    was made by calling ``task()`` on it (``notify_task = task(notify)``),
    whose ``Task`` is then found among the globals of the function's module,
    or else of any module imported (``shop/tasks.py`` making it from a
    function of ``shop/emails.py``): a look at every module, once per name
    a process does not know."""
    module, _, attribute = name.rpartition(".")
    own = sys.modules.get(module)
    candidate = getattr(own, attribute, None)
    if isinstance(candidate, Task):
        return candidate
    elsewhere = (other for other in list(sys.modules.values()) if other is not own)
    for namespace in itertools.chain([own], elsewhere):
        for value in list(getattr(namespace, "__dict__", {}).values()):
            # type(), not isinstance(): that would evaluate a lazy object's __class__.
            if issubclass(type(value), Task) and value.module_path == name:
                return value
    return None


# ---------------------------------------------------------------- the worker's side


@step
def task_started():
    """The time a task's run first started; recorded once, served on replays."""
    return timezone.now()


def register_task(name: str) -> bool:
    """Register the adapter of the task named ``name`` (:func:`_find_task`) if it
    is bound to another backend (``@task(backend="immediate")``): a run of it
    was enqueued here through ``.using(backend=...)``, but importing its module
    validated it with its own backend, so :meth:`EverystepBackend.validate_task`
    never registered it in this process. ``registry.get_workflow`` asks this for
    a name it does not know, once the run's module is imported. False when no
    such task is found, everystep's backend refuses it, or no ``TASKS`` backend
    is everystep's."""
    candidate = _find_task(name)
    if candidate is None:
        return False
    alias = _everystep_alias()
    if alias is None:
        return False
    try:
        _bound_here(candidate, alias)  # whose validate_task registers the adapter
    except InvalidTask:
        return False
    return True


def _bound_here(task: Task, alias: str) -> Task:
    """``task`` as ``.using(backend=alias)`` enqueued it: at the one priority
    and queue everystep accepts, whatever its own backend's were."""
    return task.using(backend=alias, priority=DEFAULT_TASK_PRIORITY, queue_name=DEFAULT_TASK_QUEUE_NAME)


def _everystep_alias() -> str | None:
    """The first ``TASKS`` alias whose backend is everystep's."""
    for alias in task_backends.settings:
        with contextlib.suppress(InvalidTaskBackend):  # Django's own check reports it
            if isinstance(task_backends[alias], EverystepBackend):
                return alias
    return None


def _adapter_spec(task: Task) -> registry.Spec:
    def run_task(args, kwargs):
        return _run(task, args, kwargs)

    # The task's module, not this one: a module that raises while being imported
    # unregisters what it registered by this (registry._record_failure), so a
    # task defined above the error must count as that module's.
    run_task.__module__ = task.func.__module__
    # The run page's pending steps come from the task's own function (everystep.graph).
    run_task.__everystep__ = registry.Spec(task.module_path, task.func, "workflow")
    # get_result's way back to the Task: its module path may name the plain
    # function instead (send_email_task = task(send_email)).
    run_task.task = task
    return registry.Spec(task.module_path, run_task, "workflow")


def _run(task: Task, args: list, kwargs: dict):
    ctx = current()
    task_started(everystep_id=STARTED_STEP_ID)
    # A scope of its own: the task's first step is "1", as in a workflow.
    with activate(Context(ctx.state)):
        try:
            if task.takes_context:
                result = task.get_backend().get_result(str(ctx.workflow_id))
                return task.call(TaskContext(task_result=result), *args, **kwargs)
            return task.call(*args, **kwargs)
        except (KeyboardInterrupt, GeneratorExit):
            raise  # not the task's failure: the runner lets them through
        except BaseException as exc:  # SystemExit, CancelledError too: the runner records them as failures
            # TaskError.traceback: kept in the run's error by serde.encode_exception.
            exc._everystep_traceback = "".join(traceback.format_exception(exc))
            raise
