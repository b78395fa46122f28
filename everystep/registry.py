"""Registered workflows and steps, by qualified name ``module.qualname``.

The name is what ``everystep_workflow.name`` and ``everystep_step.name`` store,
so renaming or moving a function changes its identity.
"""

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass

_lock = threading.Lock()
_workflows: dict[str, "Spec"] = {}
_steps: dict[str, "Spec"] = {}


@dataclass(frozen=True)
class Spec:
    name: str
    func: Callable
    kind: str  # "workflow" or "step"
    unsafe_to_repeat: bool = False


def qualified_name(func: Callable) -> str:
    return f"{func.__module__}.{func.__qualname__}"


def register(spec: Spec) -> None:
    table = _workflows if spec.kind == "workflow" else _steps
    with _lock:
        table[spec.name] = spec


def workflow_names() -> list[str]:
    return sorted(_workflows)


def get_workflow(name: str) -> Spec | None:
    """The workflow registered under ``name``, importing its module on first use."""
    return _lookup(_workflows, name)


def get_step(name: str) -> Spec | None:
    return _lookup(_steps, name)


def _lookup(table: dict, name: str) -> Spec | None:
    spec = table.get(name)
    if spec is None:
        _import_owner(name)
        spec = table.get(name)
    return spec


def _import_owner(name: str) -> None:
    """Import the longest module prefix of ``name``; decorators register on import."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            importlib.import_module(".".join(parts[:cut]))
            return
        except ImportError:
            continue
        except Exception:  # a broken module must not take a worker down
            return


def autodiscover() -> None:
    """Import ``workflows`` modules of all installed apps, as the admin does for ``admin``,
    and their ``tasks`` modules when a ``TASKS`` backend is everystep's: a task's name
    is registered as its module is imported (``everystep.tasks``)."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("workflows")
    if _runs_tasks():
        autodiscover_modules("tasks")


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
