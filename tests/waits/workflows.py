"""Workflows that sleep and wait for events. Effects are counted in memory
(in-process tests) and, for worker subprocesses, appended to a log file."""

import datetime as dt
import threading
from collections import Counter

from everystep import Terminal, WaitTimeout, sleep, sleep_until, step, wait_for_event, workflow

effects: Counter = Counter()
_lock = threading.Lock()


def effect(name: str) -> None:
    with _lock:
        effects[name] += 1


@step
def note(label):
    effect(label)
    return label


@step
def now_iso():
    return dt.datetime.now(dt.UTC).isoformat()


@workflow
def naps(seconds):
    note("before")
    sleep(seconds)
    return note("after")


@workflow
def naps_until(iso):
    sleep_until(dt.datetime.fromisoformat(iso))
    return note("after")


@workflow
def naps_twice(seconds):
    note("a")
    sleep(seconds)
    note("b")
    sleep(seconds, everystep_id="second")
    return note("c")


@workflow
def awaits(key, timeout=None):
    note("before")
    value = wait_for_event(key, timeout=timeout)
    note(f"got:{value}")
    return value


@workflow
def awaits_or_gives_up(key, timeout):
    try:
        value = wait_for_event(key, timeout=timeout)
    except WaitTimeout:
        return note("timed out")
    return note(f"got:{value}")


@workflow
def swaps_sleep_for_step(seconds):
    # Registered to test divergence: the first pass's code slept at step 1.
    return note("instead")


@workflow
def wakes_late(seconds):
    """Sleeps, then records when it woke (the benchmark's and the worker tests' probe)."""
    sleep(seconds)
    return now_iso()


@workflow
def shaped(nonce, ops):
    """Runs ``ops`` in order: ``["step", label]`` records a step,
    ``["sleep"]`` sleeps an hour, ``["event", key]`` waits for an event
    (``["event", key, timeout]`` with a timeout, catching it)."""
    out = []
    for op in ops:
        if op[0] == "step":
            out.append(note(f"{nonce}:{op[1]}"))
        elif op[0] == "sleep":
            out.append(sleep(3600))
        elif len(op) == 2:
            out.append(wait_for_event(op[1]))
        else:
            try:
                out.append(wait_for_event(op[1], timeout=op[2]))
            except WaitTimeout:
                out.append("timeout")
    return out


@workflow
def naps_in_a_branch(seconds):
    # parallel is imported here: the module's other workflows do not fork.
    from everystep import parallel

    return parallel(lambda: [sleep(seconds), note("slept")][1], lambda: note("beside"))


@workflow
def approval_or_cancel(timeout, ask=False):
    """Waits in two branches at once: for "cancel" (no timeout) and for
    "approval" (with ``timeout``, caught; after the step ``note("asked")``
    with ``ask``)."""
    from everystep import parallel

    def approval():
        if ask:
            note("asked")
        try:
            return wait_for_event("approval", timeout=timeout)
        except WaitTimeout:
            return note("timed out")

    return parallel(lambda: wait_for_event("cancel"), approval)


@step
def refuse(reason):
    raise Terminal(reason)


@workflow
def approval_or_refusal():
    """A branch waits for "approval" while its sibling's step stops the run."""
    from everystep import parallel

    return parallel(lambda: wait_for_event("approval"), lambda: refuse("order is invalid"))


@workflow
def waits_beyond_time(how):
    """Sleeps (or waits with a timeout) for a duration no wake time can hold."""
    if how == "timeout=inf":
        return wait_for_event("k", timeout=float("inf"))
    sleep(float("inf") if how == "inf" else dt.timedelta.max)
    return note("after")
