"""everystep: durable workflows for Django.

Importing this package imports no Django models, so ``from everystep import step``
works from a module that settings import. The public names load on first use.
"""

from importlib import import_module

# The one place the version is written: pyproject.toml reads it (setuptools'
# dynamic version), CHANGELOG.md says what each version brought.
__version__ = "0.2.0.dev0"

__all__ = [
    "workflow",
    "step",
    "parallel",
    "schedule",
    "start_child",
    "Terminal",
    "EverystepError",
    "sleep",
    "sleep_until",
    "wait_for_event",
    "send_event",
    "WaitTimeout",
    "ChildFailed",
    "ChildStopped",
]

_LAZY = {
    "workflow": "everystep.api",
    "step": "everystep.api",
    "parallel": "everystep.api",
    "schedule": "everystep.api",
    "start_child": "everystep.api",
    "Terminal": "everystep.api",
    "EverystepError": "everystep.errors",
    "sleep": "everystep.waits",
    "sleep_until": "everystep.waits",
    "wait_for_event": "everystep.waits",
    "send_event": "everystep.waits",
    "WaitTimeout": "everystep.errors",
    "ChildFailed": "everystep.errors",
    "ChildStopped": "everystep.errors",
}


def __getattr__(name):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'everystep' has no attribute {name!r}")
