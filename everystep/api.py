"""The public API: thin wrappers that delegate to the registry, runner and models."""

import functools
import inspect
from collections.abc import Callable
from typing import Any

from . import registry, runner, serde
from .errors import EverystepError, Terminal

__all__ = ["workflow", "step", "parallel", "schedule", "Terminal"]


def workflow(func: Callable) -> Callable:
    """Mark ``func`` as a workflow. Outside a run, calling it is a plain call."""
    spec = registry.Spec(registry.qualified_name(func), func, "workflow")
    registry.register(spec)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)

    wrapper.__everystep__ = spec
    return wrapper


def step(func: Callable | None = None, *, unsafe_to_repeat: bool = False):
    """Mark a function as a step; ``@step(unsafe_to_repeat=True)`` for effects that
    must never run twice. Callers may pass ``everystep_id="name"`` to name the call."""

    def decorate(func: Callable) -> Callable:
        spec = registry.Spec(registry.qualified_name(func), func, "step", unsafe_to_repeat)
        registry.register(spec)

        @functools.wraps(func)
        def wrapper(*args, everystep_id: str | None = None, **kwargs):
            return runner.call_step(spec, args, kwargs, everystep_id)

        wrapper.__everystep__ = spec
        return wrapper

    return decorate(func) if func is not None else decorate


def parallel(*branches, everystep_id: str | None = None) -> tuple:
    """Run branches concurrently and return their results in branch order.

    A branch is a zero-argument callable or a list of them run in order (its
    result is a tuple). One failure is raised as is, several as an
    ``ExceptionGroup``; a ``Terminal`` in any branch wins over both.
    """
    return runner.run_parallel(branches, everystep_id)


def schedule(workflow_func: Callable, *args: Any, idempotency_key: str | None = None):
    """Insert a ``scheduled`` run inside the caller's transaction and return its row.

    With ``idempotency_key``, a second call with the same workflow and key
    returns the existing row instead, also when two callers race.
    """
    from .models import Workflow  # not at import time: settings may import this module
    from .scheduling import insert_run

    spec = getattr(workflow_func, "__everystep__", None)
    if spec is None or spec.kind != "workflow":
        raise TypeError(f"schedule() needs a @workflow function, got {workflow_func!r}")
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
    if idempotency_key is not None and not (isinstance(idempotency_key, str) and idempotency_key):
        raise EverystepError(f"idempotency_key must be a non-empty string, got {idempotency_key!r}")
    if idempotency_key is not None and len(idempotency_key) > 255:
        raise EverystepError("idempotency_key is longer than 255 characters")
    return insert_run(Workflow, spec.name, list(args), idempotency_key)
