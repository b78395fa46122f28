"""Workflows and steps the core tests run. Effects are counted in memory."""

import contextlib
import enum
import threading
from collections import Counter

from everystep import Terminal, parallel, step, workflow
from everystep.errors import StepFailure

effects: Counter = Counter()
_lock = threading.Lock()
log: list = []


def effect(name: str) -> None:
    with _lock:
        effects[name] += 1


class Color(enum.Enum):
    RED = "red"


@step
def add(a, b):
    effect(f"add({a},{b})")
    return a + b


@step
def record(label):
    effect(label)
    return label


@step
def boom(message):
    effect(f"boom:{message}")
    raise ValueError(message)


@step
def stop_here(reason):
    effect("stop_here")
    raise Terminal(reason, {"why": reason})


@step
def echo(value):
    return value


@step(unsafe_to_repeat=True)
def charge(amount):
    effect(f"charge:{amount}")
    return {"charged": amount}


@workflow
def sequential(n):
    return [record(f"s{i}") for i in range(1, n + 1)]


@workflow
def three_steps():
    a = record("a")
    b = record("b")
    c = record("c")
    return [a, b, c]


@workflow
def named():
    record("first")
    record("second", everystep_id="second")
    return record("third")


@workflow
def forked():
    record("before")
    left, right = parallel(lambda: record("left"), lambda: record("right"))
    seq = parallel([lambda: record("s1"), lambda: record("s2")], everystep_id="fan")
    return [left, right, seq]


@workflow
def nested_forks():
    return parallel(lambda: parallel(lambda: record("deep"), lambda: record("deep2")))


@workflow
def cleanup_on_failure():
    record("reserve")
    try:
        boom("payment declined")
    except ValueError as exc:
        record("release")
        return f"cleaned up after {exc}"


@workflow
def failing():
    record("before-failure")
    boom("nope")


@workflow
def terminal_then_more():
    record("start")
    with contextlib.suppress(Terminal):
        stop_here("customer cancelled")
    record("never")


@workflow
def terminal_in_branch():
    parallel(lambda: stop_here("branch says stop"), lambda: record("sibling"))
    record("never")


@workflow
def terminal_in_branch_caught():
    with contextlib.suppress(Terminal):
        parallel(lambda: stop_here("branch says stop"), lambda: record("sibling"))
    record("never")


@workflow
def two_branch_failures():
    try:
        parallel(lambda: boom("one"), lambda: boom("two"), lambda: record("healthy"))
    except ExceptionGroup as group:
        return sorted(str(e) for e in group.exceptions)


@workflow
def one_branch_failure():
    try:
        parallel(lambda: boom("only"), lambda: record("healthy"))
    except ValueError as exc:
        return f"caught {exc}"


@workflow
def pays(amount):
    charge(amount)
    return record("shipped")


@workflow
def prepares_then_pays(amount):
    record("prepared")
    charge(amount)
    return record("shipped")


@workflow
def pays_with_cleanup(amount):
    try:
        charge(amount)
    except StepFailure as exc:
        record("refunded")
        return f"refunded: {exc}"
    return record("shipped")


@workflow
def typed_values(payload):
    return echo(payload)


@workflow
def bad_name(name):
    return record("x", everystep_id=name)


@workflow
def unserializable_argument():
    return echo(object())


@workflow
def unserializable_result():
    return make_object()


@step
def make_object():
    effect("make_object")
    return object()


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@workflow
def refused_result():
    return make_deep()


@step
def make_deep():
    effect("make_deep")
    return nested(40)  # MariaDB's JSON check refuses nesting past 32 levels


@workflow
def refused_unsafe_argument():
    return charge_deep(nested(40))


@step(unsafe_to_repeat=True)
def charge_deep(order):
    effect("charge_deep")


@workflow
def reads_context():
    from everystep import context

    record("one")
    ctx = context.current()
    return [str(ctx.workflow_id), sorted(ctx.outcomes), ctx.outcomes["1"].result]
