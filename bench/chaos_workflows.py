"""Workflows of the chaos soak. Every step's side effect is written to the
``chaos_effect`` table, on a connection of its own, so that effects are counted
independently of everystep's records."""

import os
import random
import threading
import time

import psycopg
from django.conf import settings

from bench.common import connection_params
from everystep import Terminal, WaitTimeout, parallel, sleep, start_child, step, wait_for_event, workflow
from everystep.context import current

_local = threading.local()


def _connection():
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        # Not prepared: behind PgBouncer (chaos.py --pgbouncer) a statement
        # prepared on one server connection is unknown on the next.
        conn = psycopg.connect(**connection_params(settings.DATABASES["default"]), autocommit=True,
                               prepare_threshold=None)
        _local.conn = conn
    return conn


def _write(sql, params):
    """Effects must not be lost to a database restart: retry until it is back."""
    for _ in range(120):
        try:
            return _connection().execute(sql, params).fetchone()
        except psycopg.OperationalError:
            _local.conn = None
            time.sleep(0.25)
    raise RuntimeError("effect table unreachable for 30 s")


def effect(*, unsafe=False, value=None):
    ctx = current()
    row = _write(
        "INSERT INTO chaos_effect (run_id, step_id, unsafe, pid, worker, started, value) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
        [ctx.workflow_id, ctx.running_step, unsafe, os.getpid(), ctx.state.claimer, time.time(), value],
    )
    time.sleep(random.uniform(0.02, 0.25))
    _write("UPDATE chaos_effect SET ended = %s WHERE id = %s RETURNING id", [time.time(), row[0]])


@step
def work(label):
    effect()
    return label


@step
def fail(label):
    effect()
    raise ValueError(f"{label} failed on purpose")


@step
def stop(label):
    effect()
    raise Terminal(f"{label}: stopped on purpose")


@step(unsafe_to_repeat=True)
def pay(amount):
    effect(unsafe=True)
    return {"paid": amount}


@workflow
def mixed(kind):
    work("a")
    if kind == "fork":
        parallel(lambda: work("b"), [lambda: work("c1"), lambda: work("c2")], everystep_id="fan")
    elif kind == "cleanup":
        try:
            fail("charge")
        except ValueError:
            work("cleanup")
    elif kind == "stop":
        work("b")
        stop("fraud")
    elif kind == "unsafe":
        pay(10)
        work("ship")
    work("z")
    return kind


KINDS = ["sequential", "fork", "cleanup", "stop", "unsafe"]


# The waiting workloads. Their steps write effects as the others do; the
# checker (chaos.py) knows them by workflow name.

EVENT_KEY = "go"


@step
def got(value):
    """The step after an event wait: records the value the run was served."""
    effect(value=value)
    return value


@workflow
def sleeper(seconds):
    """Effect steps with durable sleeps between them."""
    work("a")
    sleep(seconds)
    work("b")
    sleep(seconds)
    work("z")
    return "slept"


@workflow
def evented(timeout):
    """Waits for the event EVENT_KEY; the controller sends it before the wait
    is reached, after, or never (the timeout path)."""
    work("a")
    try:
        value = wait_for_event(EVENT_KEY, timeout=timeout)
    except WaitTimeout:
        work("timeout")
        return {"timeout": True}
    got(value)
    work("z")
    return {"value": value}


@workflow
def child(n):
    work("c")
    return {"child": n}


@workflow
def parent(n):
    """Starts one child and returns what it returned."""
    work("a")
    handle = start_child(child, n)
    outcome = handle.result()
    work("z")
    return {"from_child": outcome}
