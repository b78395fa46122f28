"""Per-step cost of fencing, on PostgreSQL.

The runner records each step with one fenced statement,
``INSERT INTO everystep_step ... SELECT ... FROM everystep_workflow WHERE id = %s
AND status = 'running' AND claimed_by = %s``, so that a worker that lost its
run writes nothing. This compares it with a plain ``INSERT ... VALUES`` of the
same row: single-row autocommit statements, per-statement
latency medians (plain and fenced alternate one by one), three ways:

- ``unprepared``: a psycopg cursor with server-side binding and
  ``prepare=True`` on Django's connection as Django leaves it: Django connects
  with ``prepare_threshold=None``, which disables prepared statements in
  psycopg (``prepare=True`` included), so the statement is planned each time;
- ``django``: Django's cursor (client-side binding), planned each time (the
  runner's way with ``EVERYSTEP_PREPARED_STATEMENTS = False``);
- ``prepared``: the runner's way (``everystep.statements``): the connection's
  ``prepare_threshold`` set, so PostgreSQL plans the statement once per connection.

Usage: python bench/fencing.py [--steps 2000] [--rounds 5] [--background-runs 10000]
"""

import argparse
import statistics
import time

try:
    from bench.common import setup, table
except ImportError:  # run as a script
    from common import setup, table

PLAIN_SQL = (
    "INSERT INTO everystep_step (workflow_id, step_id, name, args, kwargs, status, result, error) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
)


def prepare(background: int):
    from everystep.models import Workflow

    Workflow.objects.bulk_create(
        Workflow(name="bench.other", args=[], status="completed") for _ in range(background)
    )
    return Workflow.objects.create(name="bench.fencing", args=[], status="running", claimed_by="bench")


def row_params(run, step_id: str) -> list:
    from django.db import connection

    from everystep.models import Step

    fields = {f.name: f for f in Step._meta.fields}
    run_id = fields["workflow"].get_db_prep_value(run.id, connection)
    return [
        run_id,
        step_id,
        "bench.workflows.noop",
        fields["args"].get_db_prep_save([1], connection),
        fields["kwargs"].get_db_prep_save({}, connection),
        "done",
        fields["result"].get_db_prep_save(1, connection),
        fields["error"].get_db_prep_save(None, connection),
    ]


MODES = ("unprepared", "django", "prepared")


def measure(run, mode: str, label: str, steps: int) -> tuple[list[float], list[float]]:
    """Microseconds per statement: ``steps`` plain and ``steps`` fenced inserts,
    alternating one by one, so that load on the machine hits both alike."""
    import psycopg
    from django.db import connection

    from everystep.statements import INSERT_STEP as FENCED_SQL

    connection.ensure_connection()
    connection.connection.prepare_threshold = 0 if mode == "prepared" else None
    timings = {"plain": [], "fenced": []}
    cursor = connection.cursor() if mode == "django" else psycopg.Cursor(connection.connection)
    with cursor:
        for i in range(steps):
            order = ("plain", "fenced") if i % 2 == 0 else ("fenced", "plain")
            for kind in order:
                params = row_params(run, f"{kind}.{label}.{i}")
                sql = PLAIN_SQL
                if kind == "fenced":
                    sql, params = FENCED_SQL, params + [run.id, "bench"]
                start = time.perf_counter_ns()
                if mode == "django":
                    cursor.execute(sql, params)
                else:
                    cursor.execute(sql, params, prepare=True)
                timings[kind].append((time.perf_counter_ns() - start) / 1000)
                assert cursor.rowcount == 1
    connection.connection.prepare_threshold = None  # Django's setting
    return timings["plain"], timings["fenced"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--background-runs", type=int, default=10_000)
    args = parser.parse_args(argv)
    setup("fencing")
    run = prepare(args.background_runs)
    rows = []
    for mode in MODES:
        measure(run, mode, f"warm-{mode}", 200)  # warm up: connection, plan cache, buffers
        plain, fenced = [], []
        for round_no in range(args.rounds):
            p, f = measure(run, mode, f"{mode}{round_no}", args.steps)
            plain += p
            fenced += f
        extra = statistics.median(b - a for a, b in zip(plain, fenced, strict=True))
        rows.append(
            [mode, f"{statistics.median(plain):.0f}", f"{statistics.median(fenced):.0f}", f"{extra:+.0f}"]
        )
    print(
        f"\nFencing cost per step: {args.rounds} rounds x {args.steps} pairs of single-row autocommit "
        f"inserts, {args.background_runs} other runs in the table; medians, microseconds per statement"
    )
    print(table(rows, ["statements", "plain INSERT us", "fenced INSERT us", "median difference us"]))
    return rows


if __name__ == "__main__":
    main()
