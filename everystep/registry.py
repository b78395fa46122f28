"""Registered workflows and steps, by qualified name ``module.qualname``.

The name is what ``everystep_workflow.name`` and ``everystep_step.name`` store,
so renaming or moving a function changes its identity.

A module of workflows that raises while being imported is recorded here (one
``ImportFailure`` per module, replaced on every new attempt, dropped once the
module imports or no longer exists): the system check, the worker's start-up
and a run of one of its workflows all report that error instead of a missing
name. Whatever the module registered before it raised is unregistered again,
so no half-imported workflow ever runs.
"""

import importlib
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cron import CronSchedule

_lock = threading.Lock()
_workflows: dict[str, "Spec"] = {}
_steps: dict[str, "Spec"] = {}
_import_failures: dict[str, "ImportFailure"] = {}


@dataclass(frozen=True)
class Spec:
    name: str
    func: Callable
    kind: str  # "workflow" or "step"
    unsafe_to_repeat: bool = False
    cron: "CronSchedule | None" = None  # @workflow(cron=...): everystep.cron
    max_concurrent: int | None = None  # @workflow(max_concurrent=N): everystep.limits


@dataclass(frozen=True)
class ImportFailure:
    """A module that raised ``exception`` while being imported."""

    module: str
    exception: Exception
    file: str  # where it was raised: the innermost frame, or the bad line of a SyntaxError
    line: int | None
    traceback: str

    @property
    def where(self) -> dict:
        return {"module": self.module, "file": self.file, "line": self.line}

    def summary(self) -> str:
        """One line: the module, the exception and where it was raised."""
        exc = self.exception
        return (
            f"module {self.module!r} failed to import: {type(exc).__name__}: {exc} "
            f"({self.file}, line {self.line})"
        )


def qualified_name(func: Callable) -> str:
    return f"{func.__module__}.{func.__qualname__}"


def register(spec: Spec) -> None:
    table = _workflows if spec.kind == "workflow" else _steps
    with _lock:
        table[spec.name] = spec


def workflow_names() -> list[str]:
    return sorted(_workflows)


def schedules() -> list["CronSchedule"]:
    """The cron schedules of the registered workflows, by workflow name."""
    with _lock:
        return [spec.cron for _, spec in sorted(_workflows.items()) if spec.cron is not None]


def concurrency_limits() -> dict[str, int]:
    """``{workflow name: max_concurrent}`` of the registered workflows that have
    a limit; empty when none has (the claim then takes its unlimited path)."""
    with _lock:
        return {name: spec.max_concurrent for name, spec in _workflows.items() if spec.max_concurrent}


def get_workflow(name: str) -> Spec | None:
    """The workflow registered under ``name``, importing its module on first use
    (a django.tasks task bound to another backend is registered then)."""
    spec = _lookup(_workflows, name)
    if spec is None and _register_task(name):
        spec = _workflows.get(name)
    return spec


def get_step(name: str) -> Spec | None:
    return _lookup(_steps, name)


# How an operator's preview names a step row whose function would run again
# (``repeat_risk``): a recorded effect of such a step happens twice.
UNSAFE = "unsafe to repeat"
UNKNOWN = "may be unsafe to repeat (its function cannot be found here)"
ENGINE_PREFIX = "everystep."  # the engine's own rows (waits, a task's start): no effect of a user's


def repeat_risk(name: str) -> str:
    """Why running the step recorded as ``name`` again may repeat an effect
    that must not be: ``UNSAFE`` for a step marked ``unsafe_to_repeat``,
    ``UNKNOWN`` when no step of that name can be found in this process (its
    module fails to import here, or was renamed or moved): nothing says it is
    safe, so it gets the same confirmation. Empty for a step safe to repeat,
    and for the rows the engine writes itself."""
    if name.startswith(ENGINE_PREFIX):
        return ""
    spec = get_step(name)
    if spec is not None:
        return UNSAFE if spec.unsafe_to_repeat else ""
    # A start_child row is named after the child's workflow; started again, it
    # finds the same child by its key.
    return "" if get_workflow(name) is not None else UNKNOWN


def import_failure(name: str) -> ImportFailure | None:
    """The recorded failure of the module ``name`` lives in (or of a package above it)."""
    with _lock:
        owners = [module for module in _import_failures if name.startswith(f"{module}.")]
        return _import_failures[max(owners, key=len)] if owners else None


def _lookup(table: dict, name: str) -> Spec | None:
    spec = table.get(name)
    if spec is None:
        _import_owner(name)
        spec = table.get(name)
    return spec


def _register_task(name: str) -> bool:
    """Register ``name`` if it is a django.tasks task bound to another backend
    (``everystep.tasks.register_task``): importing its module registered nothing
    here. Nothing more is imported: the task is looked up in the module the
    name points at, if ``_lookup`` imported it."""
    module, _, attribute = name.rpartition(".")
    if getattr(sys.modules.get(module), attribute, None) is None:
        return False
    try:
        from .tasks import register_task
    except ImportError:  # Django 5.2: no django.tasks
        return False
    return register_task(name)


def _import_owner(name: str) -> None:
    """Import the modules along ``name``, outermost first, down to the last one
    that exists (decorators register on import); stop at one that raises."""
    parts = name.split(".")
    for cut in range(1, len(parts)):
        if not parts[cut - 1].isidentifier() or not _import(".".join(parts[:cut])):
            return


def autodiscover() -> list[ImportFailure]:
    """Import ``workflows`` modules of all installed apps, as the admin does for
    ``admin``, and their ``tasks`` modules when a ``TASKS`` backend is everystep's
    (a django.tasks task registers as its module is imported: ``everystep.tasks``).
    Return those that failed: an app without one is fine, a module that raises
    (also an ``ImportError`` for one of its own imports) is not."""
    from django.apps import apps

    kinds = ["workflows", "tasks"] if _runs_tasks() else ["workflows"]
    modules = [f"{app_config.name}.{kind}" for app_config in apps.get_app_configs() for kind in kinds]
    for module in modules:
        _import(module)
    with _lock:
        return [_import_failures[module] for module in modules if module in _import_failures]


def _import(module: str) -> bool:
    """Import ``module``; False when it does not exist or raised (recorded)."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if _is_missing(module, exc):
            _forget_failure(module)
        else:
            _record_failure(module, exc)
        return False
    except Exception as exc:  # whatever the module's code raised
        _record_failure(module, exc)
        return False
    _forget_failure(module)
    return True


def _is_missing(module: str, exc: ModuleNotFoundError) -> bool:
    """Whether ``module`` itself (or a package above it) does not exist, rather
    than its code importing something that does not."""
    return exc.name is not None and (module == exc.name or module.startswith(f"{exc.name}."))


def _record_failure(module: str, exc: Exception) -> None:
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, SyntaxError) and exc.filename:
        # Raised by the compiler: the frames are importlib's, the bad line is in the exception.
        file, line = exc.filename, exc.lineno
    elif frames:
        file, line = frames[-1].filename, frames[-1].lineno
    else:
        file, line = module, None
    failure = ImportFailure(
        module=module,
        exception=exc,
        file=file,
        line=line,
        traceback=_traceback_text(exc),
    )
    with _lock:
        _import_failures[module] = failure
        for table in (_workflows, _steps):
            registered_by_it = [name for name, spec in table.items() if spec.func.__module__ == module]
            for name in registered_by_it:
                del table[name]


def _traceback_text(exc: Exception) -> str:
    """The traceback from the module's own code on: the frames of this import
    and of importlib before it say nothing about the error."""
    tb = exc.__traceback__
    while tb is not None and _is_import_machinery(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb)).rstrip()


def _is_import_machinery(filename: str) -> bool:
    return filename in (__file__, importlib.__file__) or filename.startswith("<frozen importlib")


def _forget_failure(module: str) -> None:
    with _lock:
        _import_failures.pop(module, None)


def _runs_tasks() -> bool:
    from django.conf import settings
    from django.utils.module_loading import import_string

    try:
        from .tasks import EverystepBackend
    except ImportError:  # Django 5.2: no django.tasks
        return False
    for config in getattr(settings, "TASKS", {}).values():
        try:
            backend = import_string(config["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue  # Django's own check reports a broken TASKS entry
        if isinstance(backend, type) and issubclass(backend, EverystepBackend):
            return True
    return False
