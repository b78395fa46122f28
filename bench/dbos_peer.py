"""The throughput workload on the peer engine, DBOS Transact, for comparison.

Runs with the interpreter of its own virtualenv (``bench/.venv-dbos``, made by
``bench/throughput.py``; DBOS is not a dependency of everystep), against a
database of its own (made next to the one ``--url`` names, dropped at exit)
on the same PostgreSQL server. The same shape as everystep's
round: N runs of a workflow of ten trivial steps, all enqueued first on a DBOS
queue, then drained by P processes, each running at most C workflows at once
(``worker_concurrency``). The clock runs from the first dequeue
(``started_at_epoch_ms``) to the last completion (``completed_at``), both
written by DBOS itself.

Usage: bench/.venv-dbos/bin/python bench/dbos_peer.py [--runs 2000] [--processes 2]
           [--concurrency 8] [--poll 0.05] [--json FILE|-]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from common import scratch_database, stop_workers  # this script runs from bench/, in DBOS's own venv
from dbos import DBOS

QUEUE = "bench"
APP = "everystep-bench"
STEPS_PER_RUN = 10


@DBOS.step()
def noop(i):
    return i


@DBOS.workflow()
def ten_steps():
    for i in range(STEPS_PER_RUN):
        noop(i)


def launch(url: str, executor: str, *, listen: bool, concurrency: int, poll: float):
    DBOS(config={"name": APP, "system_database_url": url, "executor_id": executor, "log_level": "WARNING"})
    if not listen:
        DBOS.listen_queues([])  # the enqueuer runs nothing
    DBOS.launch()
    return DBOS.register_queue(
        QUEUE, worker_concurrency=concurrency, polling_interval_sec=poll, on_conflict="always_update"
    )


def worker(args) -> None:
    """One draining process; runs until SIGTERM."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    launch(args.url, args.worker, listen=True, concurrency=args.concurrency, poll=args.poll)
    stop.wait()
    DBOS.destroy(workflow_completion_timeout_sec=5)


def measure(args) -> dict:
    args.url = scratch_database(args.url, "peer")  # dropped when this process exits
    queue = launch(args.url, "enqueuer", listen=False, concurrency=args.concurrency, poll=args.poll)
    for _ in range(args.runs):
        queue.enqueue(ten_steps)
    DBOS.destroy()

    logdir = Path(tempfile.gettempdir()) / "everystep-bench-logs"
    logdir.mkdir(exist_ok=True)
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", f"dbos-{i}", "--url", args.url,
             "--concurrency", str(args.concurrency), "--poll", str(args.poll)],
            stdout=open(logdir / f"dbos-{i}.log", "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
        )
        for i in range(args.processes)
    ]
    sql = (
        "SELECT count(*) FILTER (WHERE status = 'SUCCESS'), count(*) FILTER (WHERE status = 'ERROR'), "
        "min(started_at_epoch_ms), max(completed_at) FROM dbos.workflow_status"
    )
    try:
        with psycopg.connect(args.url, autocommit=True) as conn:
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline:
                succeeded, failed, first, last = conn.execute(sql).fetchone()
                if succeeded + failed >= args.runs:
                    break
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a DBOS worker exited; see {logdir}")
                time.sleep(0.1)
            else:
                raise RuntimeError(f"only {succeeded} of {args.runs} DBOS workflows completed in time")
            (steps,) = conn.execute("SELECT count(*) FROM dbos.operation_outputs").fetchone()
    finally:
        stop_workers(procs)
    if failed or steps != args.runs * STEPS_PER_RUN:
        raise RuntimeError(f"{failed} DBOS workflows failed, {steps} steps recorded")
    seconds = (last - first) / 1000
    from importlib.metadata import version

    return {"runs": args.runs, "seconds": seconds, "runs_per_s": args.runs / seconds,
            "steps_per_s": args.runs * STEPS_PER_RUN / seconds, "version": version("dbos")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--poll", type=float, default=0.05)
    parser.add_argument("--url", default=os.environ.get(
        "DBOS_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/dbos_bench"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write the figures as JSON to this file (- for stdout)")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    figures = measure(args)
    text = json.dumps(figures)
    if args.json == "-":
        print(text)
    elif args.json:
        Path(args.json).write_text(text)
    else:
        print(f"DBOS Transact {figures['version']}: {figures['runs']} runs in {figures['seconds']:.2f} s, "
              f"{figures['runs_per_s']:.0f} runs/s, {figures['steps_per_s']:.0f} steps/s")


if __name__ == "__main__":
    main()
