"""Cron schedules on PostgreSQL: how late each slot starts, with one worker and
with several racing for every slot, and what the check costs the claim loop.

A schedule fires every second (``bench.cronapp``, ``* * * * * *``) while N
worker processes run for D seconds. Per slot: the *start delay* is the run's
``created_at`` (its insert, by the winning worker) minus the slot's time; the
*first step* is when the run's first step started (``time.time()`` in the
step) minus the slot's time; same machine, same clock. Also counted: slots
between the first and the last with no run (skipped), and slots with more than
one run (the unique key makes that impossible; counted all the same).

The loop's cost: ``CronStarter.start_due()`` plus ``timeout()`` with 10
schedules and no slot due, timed in-process (no query is made then).

Usage: python bench/cron.py [--seconds 30] [--workers 1,3] [--json FILE]
"""

import argparse
import datetime as dt
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import LOGDIR, median, percentile, setup, start_worker, stop_workers, table  # noqa: E402

TICK = "bench.cronapp.workflows.tick"


def race(workers: int, seconds: float) -> dict:
    from django.db import connection

    from everystep.cron import slot_of
    from everystep.models import Step, Workflow

    Workflow.objects.all().delete()
    logs = [open(LOGDIR / f"cron-{workers}-{i}.log", "w") for i in range(workers)]  # noqa: SIM115
    # Settings with bench.cronapp installed: the workers find its schedule at start-up.
    procs = [
        start_worker(f"cron-{i}", pool=4, poll=0.2, log=logs[i], settings="bench.cron_settings")
        for i in range(workers)
    ]
    try:
        time.sleep(seconds)
    finally:
        stop_workers(procs)
        for log in logs:
            log.close()
    connection.close()
    runs = list(Workflow.objects.filter(name=TICK).values_list("id", "idempotency_key", "created_at"))
    first_steps = dict(
        Step.objects.filter(workflow__name=TICK, step_id="1").values_list("workflow_id", "result")
    )
    slots = [(slot_of(key), created, first_steps.get(run_id)) for run_id, key, created in runs]
    slots.sort()
    delays = [(created - slot).total_seconds() * 1000 for slot, created, _ in slots]
    steps = [(started - slot.timestamp()) * 1000 for slot, _, started in slots if started is not None]
    span = int((slots[-1][0] - slots[0][0]).total_seconds()) + 1 if slots else 0
    per_slot = Counter(slot for slot, _, _ in slots)
    return {
        "workers": workers,
        "slots": len(per_slot),
        "skipped": span - len(per_slot),
        "duplicates": sum(n - 1 for n in per_slot.values()),
        "delay_p50_ms": round(median(delays), 1),
        "delay_p99_ms": round(percentile(delays, 0.99), 1),
        "step_p50_ms": round(median(steps), 1),
        "step_p99_ms": round(percentile(steps, 0.99), 1),
    }


def loop_cost(calls: int = 100_000) -> float:
    """Microseconds per start_due() + timeout() with 10 schedules, none due."""
    from everystep.cron import CronSchedule, CronStarter

    schedules = [CronSchedule(f"bench.flows.f{i}", f"{i} 3 * * *") for i in range(10)]
    starter = CronStarter(schedules, runner="bench")
    for entry in starter._entries:  # as after the first check: the next slots are hours away
        entry.due = entry.schedule.next_after(dt.datetime.now(dt.UTC))
    began = time.perf_counter()
    for _ in range(calls):
        starter.start_due()
        starter.timeout(0.2)
    return (time.perf_counter() - began) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--workers", default="1,3", help="worker counts, comma-separated")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    setup("cron")
    rows = [race(int(n), args.seconds) for n in args.workers.split(",")]
    headers = list(rows[0])
    print(table([[row[h] for h in headers] for row in rows], headers))
    cost = loop_cost()
    print(f"claim loop: start_due() + timeout() with 10 schedules, none due: {cost:.2f} us per iteration")
    if args.json:
        Path(args.json).write_text(json.dumps({"races": rows, "loop_cost_us": round(cost, 2)}, indent=2))


if __name__ == "__main__":
    main()
