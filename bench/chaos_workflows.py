"""Workflows of the chaos soak. Every step's side effect is written to the
``chaos_effect`` table, on a connection of its own, so that effects are counted
independently of everystep's records."""

import os
import random
import threading
import time

import psycopg
from django.conf import settings

from everystep import Terminal, parallel, step, workflow
from everystep.context import current

_local = threading.local()


def _connection():
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        db = settings.DATABASES["default"]
        # Not prepared: behind PgBouncer (chaos.py --pgbouncer) a statement
        # prepared on one server connection is unknown on the next.
        conn = psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"],
                               dbname=db["NAME"], autocommit=True, prepare_threshold=None)
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


def effect(*, unsafe=False):
    ctx = current()
    row = _write(
        "INSERT INTO chaos_effect (run_id, step_id, unsafe, pid, worker, started) "
        "VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
        [ctx.workflow_id, ctx.running_step, unsafe, os.getpid(), ctx.state.claimer, time.time()],
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
