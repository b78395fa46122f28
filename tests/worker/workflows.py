"""Workflows the worker tests run, in-process and in worker subprocesses.

Steps append lines to a log file given as an argument (``O_APPEND`` writes of
one short line are atomic across processes), so a test can count how often
each step of each run started and ended, and under which worker. Gates are
files a test creates to let a waiting step or body go on.
"""

import os
import threading
import time
from pathlib import Path

from everystep import parallel, step, workflow
from everystep.context import current
from everystep.models import Workflow


def log_line(path: str, *words) -> None:
    with open(path, "a") as log:
        log.write(" ".join(str(word) for word in words) + "\n")


def _where() -> tuple:
    ctx = current()
    return ctx.workflow_id, ctx.state.claimer


def _wait_for_file(path: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {path} was never opened")
        time.sleep(0.02)


@step
def mark(log: str, index: int, delay: float = 0):
    """Logs ``start``, sleeps ``delay``, logs ``end``: a kill mid-sleep leaves only ``start``."""
    run_id, claimer = _where()
    log_line(log, "start", run_id, index, claimer, os.getpid())
    time.sleep(delay)
    log_line(log, "end", run_id, index, claimer, os.getpid())
    return index


@step
def wait_gate(log: str, gate: str):
    """A step that runs until the test opens ``gate``; returns the claimer that ran it."""
    run_id, claimer = _where()
    log_line(log, "start", run_id, 1, claimer, os.getpid())
    _wait_for_file(gate)
    log_line(log, "end", run_id, 1, claimer, os.getpid())
    return claimer


@step
def gated(log: str, gate: str, index: int):
    """Like ``wait_gate``, logged under ``index``."""
    run_id, claimer = _where()
    log_line(log, "start", run_id, index, claimer, os.getpid())
    _wait_for_file(gate)
    log_line(log, "end", run_id, index, claimer, os.getpid())
    return claimer


@workflow
def forked_gates(log: str, gate_a: str, gate_b: str):
    """Step 1, then a fork whose two branches each wait for their gate (steps
    ``2.0.1`` and ``2.1.1``), then step 3."""
    mark(log, 1)
    ran_by = parallel(lambda: gated(log, gate_a, 20), lambda: gated(log, gate_b, 21))
    mark(log, 3)
    return list(ran_by)


@workflow
def chain(log: str, steps: int, delay: float = 0):
    return [mark(log, i, delay) for i in range(1, steps + 1)]


@workflow
def held(log: str, gate: str):
    """Step 1 waits for the gate; step 2 is quick."""
    ran_by = wait_gate(log, gate)
    mark(log, 2)
    return ran_by


@workflow
def gapped(log: str, gate: str):
    """Step 1, then code between steps that waits for the gate, then step 2."""
    mark(log, 1)
    _wait_for_file(gate)
    mark(log, 2)
    return "done"


@step
def delete_own_run():
    Workflow.objects.filter(id=current().workflow_id).delete()


@workflow
def self_deleting():
    delete_own_run()
    return "unreachable"


# ---------------------------------------------------------------- in-process concurrency probe

_lock = threading.Lock()
occupancy = {"now": 0, "max": 0}


@step
def occupy(delay: float):
    with _lock:
        occupancy["now"] += 1
        occupancy["max"] = max(occupancy["max"], occupancy["now"])
    time.sleep(delay)
    with _lock:
        occupancy["now"] -= 1


@workflow
def busy(delay: float):
    occupy(delay)


@step(unsafe_to_repeat=True)
def charge(amount):
    return amount


@step(unsafe_to_repeat=True)
def pay(log: str, amount: int):
    """An unsafe-to-repeat step whose effect is a log line (index ``pay``)."""
    run_id, claimer = _where()
    log_line(log, "start", run_id, "pay", claimer, os.getpid())
    return amount


@workflow
def settle(log: str, gate: str, amount: int):
    """``pay`` (unsafe to repeat), then code between steps that waits for the gate, then step 2."""
    paid = pay(log, amount)
    _wait_for_file(gate)
    mark(log, 2)
    return paid


@step
def fail(message):
    raise ValueError(message)


@workflow
def failing(message):
    fail(message)


@step
def session_id():
    """The server session of the connection everystep's statements go through
    (this thread's): PostgreSQL's backend pid, MariaDB/MySQL's connection id,
    for SQLite the connection object's identity."""
    from everystep import database

    conn = database.connection()
    conn.ensure_connection()
    if conn.vendor == "sqlite":
        return id(conn.connection)
    query = "SELECT pg_backend_pid()" if conn.vendor == "postgresql" else "SELECT CONNECTION_ID()"
    with conn.cursor() as cursor:
        cursor.execute(query)
        return cursor.fetchone()[0]


@workflow
def report_session():
    return session_id()


def read_log(path) -> list[tuple]:
    """The log as (event, run_id, index, claimer, pid) tuples."""
    path = Path(path)
    if not path.exists():
        return []
    return [tuple(line.split()) for line in path.read_text().splitlines()]
