"""A workflow the browser test re-runs and forks from a step; each step counts
its executions, so the test sees which functions ran again."""

import threading
from collections import Counter

from everystep import parallel, step, workflow

_lock = threading.Lock()
counts: Counter = Counter()


def count(name: str) -> None:
    with _lock:
        counts[name] += 1


@step
def pick(order):
    count("pick")
    return {"order": order, "items": ["book"]}


@step(unsafe_to_repeat=True)
def charge_card(order, amount):
    count("charge_card")
    return {"charged": amount}


@step
def pack(order):
    count("pack")
    return f"packed {order}"


@step
def ship(order):
    count("ship")
    return f"shipped {order}"


@workflow
def order_flow(order):
    pick(order)
    parallel(lambda: charge_card(order, 20), lambda: pack(order), everystep_id="prepare")
    return ship(order)
