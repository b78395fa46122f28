"""Pickup latency on PostgreSQL: from the commit of ``schedule()`` to the first
step of the run starting.

Runs are scheduled one at a time, each in its own transaction, with small
random gaps, while one idle worker process waits. The first step returns
``time.time()`` as it starts; the latency is that minus the time the
scheduling transaction's COMMIT returned (same machine, same clock). Two
modes:

- ``notify``: the default worker (``everystep_worker``), woken by LISTEN/NOTIFY;
- ``poll``: the same worker with ``--no-listen``, so only its poll
  (``--poll``, default 0.2 s) finds new runs.

Usage: python bench/pickup.py [--runs 200] [--poll 0.2] [--json FILE]
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import LOGDIR, median, percentile, setup, start_worker, stop_workers, table  # noqa: E402

WARM_UP = 5


def wait_done(ids, timeout: float = 120) -> None:
    from django.db import connection

    from everystep.models import Workflow

    deadline = time.monotonic() + timeout
    while Workflow.objects.filter(id__in=ids, status__in=["scheduled", "running"]).exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"runs still not done after {timeout} s; see the logs in {LOGDIR}")
        connection.close()  # see other connections' commits at once
        time.sleep(0.05)


def schedule_committed():
    """Schedule one run in its own transaction; its id and when COMMIT returned."""
    from django.db import transaction

    from bench.timed_workflows import stamp
    from everystep import schedule

    with transaction.atomic():
        run = schedule(stamp)
    return run.id, time.time()


def latencies(mode: str, runs: int, poll: float, gaps: tuple[float, float], rng) -> list[float]:
    """Milliseconds from commit to the first step starting, one per run."""
    from everystep.models import Step

    log = open(LOGDIR / f"pickup-{mode}.log", "w")  # noqa: SIM115 - kept open for the child
    extra = [] if mode == "notify" else ["--no-listen"]
    proc = start_worker("bench-pickup", pool=4, poll=poll, log=log, extra=extra)
    try:
        # Warm-up: the worker is up, has imported the workflow, and is idle again.
        wait_done([schedule_committed()[0] for _ in range(WARM_UP)])
        time.sleep(gaps[1])
        committed = {}
        for _ in range(runs):
            time.sleep(rng.uniform(*gaps))
            run_id, at = schedule_committed()
            committed[run_id] = at
        wait_done(list(committed))
    finally:
        stop_workers([proc])
    started = dict(
        Step.objects.filter(workflow_id__in=list(committed), step_id="1").values_list("workflow_id", "result")
    )
    return [(started[run_id] - at) * 1000 for run_id, at in committed.items()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--poll", type=float, default=0.2)
    parser.add_argument("--min-gap", type=float, default=0.02)
    parser.add_argument("--max-gap", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    setup("pickup")
    rng = random.Random(args.seed)
    figures, rows = {}, []
    for mode in ("notify", "poll"):
        ms = latencies(mode, args.runs, args.poll, (args.min_gap, args.max_gap), rng)
        figures[mode] = {"p50_ms": median(ms), "p99_ms": percentile(ms, 0.99), "max_ms": max(ms),
                         "runs": len(ms)}
        rows.append([
            "LISTEN/NOTIFY" if mode == "notify" else f"polling only ({args.poll} s)",
            *(f"{figures[mode][key]:.1f}" for key in ("p50_ms", "p99_ms", "max_ms")),
        ])
    print(f"\nPickup latency: commit of schedule() to the first step starting, {args.runs} runs one at a "
          f"time, gaps {args.min_gap}-{args.max_gap} s, one idle worker")
    print(table(rows, ["wake-up", "p50 ms", "p99 ms", "max ms"]))
    if args.json:
        Path(args.json).write_text(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
