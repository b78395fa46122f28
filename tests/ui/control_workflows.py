"""Workflows the action tests drive, with a real worker in the browser tests."""

import threading
import time

from everystep import parallel, step, workflow

_lock = threading.Lock()
attempts: dict[str, int] = {}  # flaky_sync's tries per key
events: list[tuple[str, int, float]] = []  # slow_step's ("start" | "end", n, time.time())
PACE = 0.5  # seconds per slow step


@step
def fetch(key):
    return {"key": key, "items": ["book"]}


@step
def flaky_sync(key):
    """Fails on its first try for a key, succeeds when the run is retried."""
    with _lock:
        attempts[key] = attempts.get(key, 0) + 1
        tries = attempts[key]
    if tries == 1:
        raise ConnectionError(f"inventory service timed out for {key}")
    return {"synced": key}


@step
def notify(key):
    return f"notified {key}"


@workflow
def inventory_sync(key):
    """Fails once, then completes on Retry (as the demo's inventory_sync)."""
    fetch(key)
    flaky_sync(key)
    return notify(key)


@step
def slow_step(n):
    events.append(("start", n, time.time()))
    time.sleep(PACE)
    events.append(("end", n, time.time()))
    return n


@workflow
def slow_steps(count):
    for n in range(count):
        slow_step(n)
    return count


@step(unsafe_to_repeat=True)
def charge(key, amount):
    return {"charged": amount, "key": key}


@step
def receipt(key):
    return f"receipt for {key}"


@workflow
def checkout(key, amount):
    """An unsafe-to-repeat charge: a crash right after it leaves the run blocked."""
    charge(key, amount)
    return receipt(key)


gates: dict[str, threading.Event] = {}  # wait_at_gate's gates, by name


@step
def wait_at_gate(name):
    """Runs until the test sets ``gates[name]``."""
    if not gates.setdefault(name, threading.Event()).wait(30):
        raise TimeoutError(f"gate {name} was never opened")
    return name


@workflow
def gated_pair(key):
    """A fork whose two branches wait on their gates: two steps running at once."""
    fetch(key)
    parallel(lambda: wait_at_gate("a"), lambda: wait_at_gate("b"))
    return notify(key)
