"""Durable waits on PostgreSQL, at scale: wake lateness with 100,000 sleeping
runs, worker capacity beside them, and the time from ``send_event``'s commit
to the waiting run resuming.

1. Capacity: one worker process (pool 8) runs ``--quick`` one-step runs,
   first on an empty database, then beside ``--sleepers`` minus ``--due``
   sleeping runs (by default 99,500, inserted in bulk as a suspension writes them: the run
   ``waiting``, its sleep's ``started`` step row, its ``everystep_wait`` row).
   Sleeping runs hold no worker slot: the two times should match.
2. Wake lateness: ``--due`` of the sleepers (inserted last) wake within
   ``--window`` seconds (the others an hour later, so the wait table stays at
   full size); each
   woken run's next step records ``time.time()``; lateness is that minus its
   recorded wake time (same machine, same clock). A late run is late by the
   wake-up (the worker's timer, bounded by the next wake time) plus the claim
   and the replay.
3. Event resume: ``--events`` runs wait for the event ``go``; they are sent
   one at a time, each in its own transaction, with random gaps; the latency
   is from the send's COMMIT returning to the run's next step starting
   (LISTEN/NOTIFY wakes the idle worker). As a baseline on the same worker
   and machine, as many new runs are scheduled one at a time the same way.

Usage: python bench/waits.py [--sleepers 100000] [--due 500] [--window 20]
       [--events 200] [--quick 2000] [--poll 0.2] [--json FILE]
"""

import argparse
import datetime as dt
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import LOGDIR, median, percentile, setup, start_worker, stop_workers, table  # noqa: E402

BATCH = 5000


def wait_until(predicate, what: str, timeout: float = 600) -> None:
    from django.db import connection

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}; see the logs in {LOGDIR}")
        connection.close()
        time.sleep(0.05)


def count(ids, status: str) -> int:
    from everystep.models import Workflow

    return Workflow.objects.filter(id__in=ids, status=status).count()


def insert_sleepers(n: int, due: int, start: dt.datetime, window: float) -> list:
    """``n`` runs of ``sleeper`` as their suspension leaves them; the first
    ``due`` of them wake between ``start`` and ``start + window``, the rest an
    hour after ``start``. Returns the ids of the due ones."""
    import uuid6

    from everystep import waits
    from everystep.models import Step, Wait, Workflow

    due_ids = []
    for first in range(0, n, BATCH):
        runs, steps, rows = [], [], []
        for i in range(first, min(n, first + BATCH)):
            if i < due:
                wake_at = start + dt.timedelta(seconds=window * i / max(1, due))
            else:
                wake_at = start + dt.timedelta(hours=1, seconds=i / 100)
            run = Workflow(id=uuid6.uuid7(), name="bench.wait_workflows.sleeper", args=[60],
                           status="waiting")
            runs.append(run)
            if i < due:
                due_ids.append(run.id)
            params = {"kind": "time", "key": None, "wake_at": wake_at}
            steps.append(Step(workflow_id=run.id, step_id="1", name=waits.SLEEP, args=[60],
                              kwargs=params, status="started"))
            rows.append(Wait(run_id=run.id, step_id="1", kind="time", wake_at=wake_at))
        Workflow.objects.bulk_create(runs)
        Step.objects.bulk_create(steps)
        Wait.objects.bulk_create(rows)
    from django.db import connection

    with connection.cursor() as cursor:
        # As autovacuum would after such growth: plans from fresh statistics.
        cursor.execute("ANALYZE everystep_workflow, everystep_step, everystep_wait")
    return due_ids


def quick_runs(n: int) -> float:
    """Seconds for one worker to run ``n`` one-step runs scheduled at once."""
    from django.db import transaction

    from bench.wait_workflows import quick
    from everystep import schedule

    with transaction.atomic():
        ids = [schedule(quick).id for _ in range(n)]
    began = time.monotonic()
    wait_until(lambda: count(ids, "completed") == n, "the quick runs")
    return time.monotonic() - began


def lateness(due_ids) -> list[float]:
    from everystep.models import Step

    rows = Step.objects.filter(workflow_id__in=due_ids)
    woke = dict(rows.filter(step_id="2").values_list("workflow_id", "result"))
    wake_at = dict(rows.filter(step_id="1").values_list("workflow_id", "kwargs"))
    return [(woke[run_id] - wake_at[run_id]["wake_at"].timestamp()) * 1000 for run_id in due_ids]


def pickup_latencies(n: int, rng) -> list[float]:
    """The baseline: ``schedule()``'s commit to a new run's step starting, measured
    the same way on the same worker (bench/pickup.py measures it alone)."""
    from django.db import transaction

    from bench.wait_workflows import quick
    from everystep import schedule
    from everystep.models import Step

    committed = {}
    for _ in range(n):
        time.sleep(rng.uniform(0.02, 0.1))
        with transaction.atomic():
            run_id = schedule(quick).id
        committed[run_id] = time.time()
    wait_until(lambda: count(list(committed), "completed") == n, "the baseline runs")
    started = dict(Step.objects.filter(workflow_id__in=list(committed)).values_list("workflow_id", "result"))
    return [(started[run_id] - at) * 1000 for run_id, at in committed.items()]


def event_latencies(n: int, rng) -> list[float]:
    from django.db import transaction

    from bench.wait_workflows import listener
    from everystep import schedule, send_event
    from everystep.models import Step

    with transaction.atomic():
        ids = [schedule(listener).id for _ in range(n)]
    wait_until(lambda: count(ids, "waiting") == n, "the listeners to wait")
    time.sleep(0.5)
    committed = {}
    for run_id in ids:
        time.sleep(rng.uniform(0.02, 0.1))
        with transaction.atomic():
            send_event(run_id, "go", None)
        committed[run_id] = time.time()
    wait_until(lambda: count(ids, "completed") == n, "the listeners to resume")
    resumed = dict(Step.objects.filter(workflow_id__in=ids, step_id="2").values_list("workflow_id", "result"))
    return [(resumed[run_id] - at) * 1000 for run_id, at in committed.items()]


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sleepers", type=int, default=100_000)
    parser.add_argument("--due", type=int, default=500)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--quick", type=int, default=2000)
    parser.add_argument("--poll", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.due > args.sleepers:
        parser.error("--due must not exceed --sleepers")
    setup("waits")
    from django.utils import timezone

    rng = random.Random(args.seed)
    log = open(LOGDIR / "waits-worker.log", "w")  # noqa: SIM115 - kept open for the child
    proc = start_worker("bench-waits", pool=8, poll=args.poll, log=log)
    figures = {}
    try:
        quick_runs(50)  # warm-up: the worker is up and has imported the workflows
        empty = quick_runs(args.quick)
        began = time.monotonic()
        insert_sleepers(args.sleepers - args.due, 0, timezone.now(), 0)
        inserted = time.monotonic() - began
        beside = quick_runs(args.quick)
        # The due ones last, once the table is full: their wake times start 2 s
        # after their insert, so none is due before it is there.
        due_ids = insert_sleepers(args.due, args.due, timezone.now() + dt.timedelta(seconds=2), args.window)
        wait_until(lambda: count(due_ids, "completed") == len(due_ids), "the due sleepers",
                   timeout=120 + args.sleepers / 1000 + args.window)
        late = lateness(due_ids)
        events = event_latencies(args.events, rng)
        baseline = pickup_latencies(args.events, rng)
    finally:
        stop_workers([proc])
    figures = {
        "sleepers": args.sleepers,
        "insert_s": inserted,
        "quick_runs": args.quick,
        "quick_empty_s": empty,
        "quick_beside_sleepers_s": beside,
        "capacity_ratio": beside / empty,
        "due": args.due,
        "window_s": args.window,
        "lateness_p50_ms": median(late),
        "lateness_p99_ms": percentile(late, 0.99),
        "lateness_max_ms": max(late),
        "event_p50_ms": median(events),
        "event_p99_ms": percentile(events, 0.99),
        "event_max_ms": max(events),
        "pickup_p50_ms": median(baseline),
        "pickup_p99_ms": percentile(baseline, 0.99),
    }
    print(f"\n{args.sleepers - args.due} sleeping runs inserted in {inserted:.1f} s; one worker process, "
          f"pool 8, poll {args.poll} s")
    print(table([
        [f"{args.quick} one-step runs, empty database", f"{empty:.2f} s"],
        [f"{args.quick} one-step runs beside {args.sleepers - args.due} sleepers", f"{beside:.2f} s"],
        ["ratio (beside / empty)", f"{beside / empty:.2f}"],
    ], ["capacity", "time"]))
    print(f"\nWake lateness of {args.due} sleepers due within {args.window} s (wake time to the next step)")
    print(table([[f"{figures['lateness_p50_ms']:.1f}", f"{figures['lateness_p99_ms']:.1f}",
                  f"{figures['lateness_max_ms']:.1f}"]], ["p50 ms", "p99 ms", "max ms"]))
    print(f"\nsend_event commit to the run's next step, {args.events} runs one at a time (LISTEN/NOTIFY)")
    print(table([
        ["send_event commit to the run's next step", f"{figures['event_p50_ms']:.1f}",
         f"{figures['event_p99_ms']:.1f}", f"{figures['event_max_ms']:.1f}"],
        ["baseline: schedule() commit to a new run's step", f"{figures['pickup_p50_ms']:.1f}",
         f"{figures['pickup_p99_ms']:.1f}", f"{max(baseline):.1f}"],
    ], ["", "p50 ms", "p99 ms", "max ms"]))
    if args.json:
        Path(args.json).write_text(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
