"""Step overhead and replay, on PostgreSQL, side by side with the raw limits.

1. A run of 1,000 trivial steps executed by one thread, as steps/s, next to a
   psycopg loop of single-row autocommit INSERTs of an everystep_step-shaped
   row (the Python floor) and the same through the Django ORM.
2. Resuming a run with 10,000 recorded steps: time to load and replay to the
   first unrecorded step, and peak memory (tracemalloc) per recorded step.

Usage: python bench/step_overhead.py [--steps 1000] [--rounds 5]
"""

import argparse
import json
import time
import tracemalloc
from pathlib import Path

try:
    from bench.common import connection_params, median, setup, table
except ImportError:  # run as a script
    from common import connection_params, median, setup, table


def engine_round(n: int) -> float:
    from bench.workflows import many_steps
    from everystep import runner, schedule
    from everystep.models import Workflow

    run = schedule(many_steps, n)
    Workflow.objects.filter(id=run.id).update(status="running", claimed_by="bench")
    run = Workflow.objects.get(id=run.id)
    start = time.perf_counter()
    status = runner.execute(run, "bench")
    elapsed = time.perf_counter() - start
    assert status == "completed", status
    return n / elapsed


def psycopg_round(n: int) -> float:
    import psycopg
    from django.conf import settings
    from psycopg.types.json import Jsonb

    from everystep.models import Workflow

    run = Workflow.objects.create(name="bench.raw", args=[], status="running", claimed_by="raw")
    with psycopg.connect(**connection_params(settings.DATABASES["default"]), autocommit=True) as conn:
        sql = ("INSERT INTO everystep_step (workflow_id, step_id, name, args, kwargs, status, "
               "result, error) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)")
        start = time.perf_counter()
        for i in range(n):
            conn.execute(sql, [run.id, str(i + 1), "bench.workflows.noop", Jsonb([i]), Jsonb({}),
                               "done", Jsonb(i), None])
        elapsed = time.perf_counter() - start
    return n / elapsed


def orm_round(n: int) -> float:
    from everystep.models import Step, Workflow

    run = Workflow.objects.create(name="bench.orm", args=[], status="running", claimed_by="orm")
    start = time.perf_counter()
    for i in range(n):
        Step.objects.create(workflow=run, step_id=str(i + 1), name="bench.workflows.noop",
                            args=[i], kwargs={}, status="done", result=i)
    elapsed = time.perf_counter() - start
    return n / elapsed


def replay(recorded: int) -> tuple[float, float]:
    """Seconds to load and replay ``recorded`` steps, and peak KB per step."""
    from bench.workflows import many_steps
    from everystep import runner, schedule
    from everystep.errors import SimulatedCrash
    from everystep.models import Step, Workflow

    run = schedule(many_steps, recorded + 1)
    Step.objects.bulk_create(
        Step(workflow_id=run.id, step_id=str(i + 1), name="bench.workflows.noop", args=[i],
             kwargs={}, status="done", result=i)
        for i in range(recorded)
    )
    first_new = str(recorded + 1)
    reached = {}

    def stop_at_first_new(ctx, step_id):
        if step_id == first_new:
            reached["at"] = time.perf_counter()
            raise SimulatedCrash("benchmark: stop at the first unrecorded step")

    def once(trace: bool):
        Workflow.objects.filter(id=run.id).update(status="running", claimed_by="bench")
        row = Workflow.objects.get(id=run.id)
        if trace:
            tracemalloc.start()
        start = time.perf_counter()
        runner.fault = stop_at_first_new
        try:
            runner.execute(row, "bench")
        finally:
            runner.fault = None
        peak = 0
        if trace:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        return reached["at"] - start, peak

    seconds = median([once(False)[0] for _ in range(5)])
    _, peak = once(True)
    return seconds, peak / recorded / 1024


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replay-steps", type=int, default=10_000)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.rounds < 1 or args.replay_steps < 1:
        parser.error("--steps, --rounds and --replay-steps must be at least 1")
    setup("overhead")
    rates = {"engine": [], "psycopg": [], "orm": []}
    for _ in range(args.rounds):  # interleaved, so that machine noise hits all three alike
        rates["psycopg"].append(psycopg_round(args.steps))
        rates["orm"].append(orm_round(args.steps))
        rates["engine"].append(engine_round(args.steps))
    med = {k: median(v) for k, v in rates.items()}
    print(f"\nStep overhead: {args.steps} trivial steps, {args.rounds} interleaved rounds, medians")
    print(table(
        [
            ["everystep (1 thread)", f"{med['engine']:.0f}", "", ""],
            ["raw psycopg INSERT", f"{med['psycopg']:.0f}", f"{med['engine'] / med['psycopg']:.0%}",
             ">= 85%"],
            ["Django ORM create()", f"{med['orm']:.0f}", f"{med['engine'] / med['orm']:.0%}", ""],
        ],
        ["path", "steps/s", "everystep / path", "target"],
    ))
    seconds, kb = replay(args.replay_steps)
    print(f"\nReplay of {args.replay_steps} recorded steps to the first unrecorded one")
    print(table([[f"{seconds:.3f} s", "<= 0.5 s", f"{kb:.2f} KB", "a few KB"]],
                ["median time", "target", "peak memory / step", "target"]))
    if args.json:
        figures = {"steps_per_s": med, "replay_s": seconds, "replay_kb_per_step": kb}
        Path(args.json).write_text(json.dumps(figures))
    return med, seconds, kb


if __name__ == "__main__":
    main()
