"""Workflows the re-run and fork tests drive. Each step function counts its
executions in ``tests.core.workflows.effects``.

``interleaved`` has a fork whose two sequence branches are recorded in a fixed
interleaving, enforced with events rather than with timing: a step waits for
the start of a step that can only start once the awaited record exists (the
next step of a branch starts after the previous one's record). Its recording
order is::

    1  fan.0.1  fan.1.1  fan.0.2  {fan.1.2 anywhere after fan.1.1}  fan.1.3  fan.1.4  3  4

with ``fan.0.3`` anywhere after ``fan.0.2``, ``fan.1.4`` and ``3`` unsafe to repeat.
"""

import threading

from everystep import parallel, step, workflow

from .workflows import charge, effect

WAIT = 30  # seconds; a broken ordering fails loudly instead of hanging
_lock = threading.Lock()
_started: dict[str, threading.Event] = {}
attempts: dict[str, int] = {}


def started(label: str) -> threading.Event:
    with _lock:
        return _started.setdefault(label, threading.Event())


def reset() -> None:
    with _lock:
        _started.clear()
        attempts.clear()


@step
def ordered(label, wait=None):
    """Signals its start, then waits for the start of step ``wait`` (once:
    the events stay set, so a replay that runs it again does not wait)."""
    started(label).set()
    effect(label)
    if wait is not None and not started(wait).wait(WAIT):
        raise RuntimeError(f"{label} waited {WAIT}s for {wait} to start")
    return label


@workflow
def interleaved(amount):
    ordered("top")
    parallel(
        [lambda: ordered("a1"), lambda: ordered("a2", wait="bx"), lambda: ordered("a3")],
        [
            lambda: ordered("b1", wait="a2"),
            lambda: ordered("bx"),
            lambda: ordered("b2", wait="a3"),
            lambda: charge(amount),
        ],
        everystep_id="fan",
    )
    charge(amount * 10)
    return ordered("end")


@step
def flaky(key):
    """Fails on its first call for a key, succeeds afterwards."""
    with _lock:
        attempts[key] = attempts.get(key, 0) + 1
        tries = attempts[key]
    effect(f"flaky:{key}")
    if tries == 1:
        raise ConnectionError(f"timed out for {key}")
    return f"synced {key}"


@workflow
def syncs(key):
    ordered("fetch")
    flaky(key)
    return ordered("notify")


@workflow
def charge_alongside(amount):
    """An unsafe charge in one branch, two steps in the other, then one more."""
    parallel(lambda: charge(amount), [lambda: ordered("b1"), lambda: ordered("b2")])
    return ordered("end")
