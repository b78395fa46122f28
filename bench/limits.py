"""What a concurrency limit costs a claim, on PostgreSQL.

One claim of up to 4 runs (``everystep.claims.claim_runs``, as a worker's
loop calls it), its latency measured on a queue of ``--backlog`` scheduled
runs, four ways (five with ``--ahead``):

- ``no limit declared``: no registered workflow has ``max_concurrent``: the
  claim is the plain statement (the baseline);
- ``limit declared, idle``: a workflow with ``max_concurrent`` is registered
  but has no runs waiting: one peek (its running count, its oldest waiting
  run) before the claim, which also skips the limited name;
- ``limit declared, full``: the limited workflow has runs waiting and all its
  slots taken: the same peek, then the same claim (no lock);
- ``limited runs, room``: the claim takes the limited workflow's runs: the
  peek, then a transaction that writes its lock row, counts its running
  runs and claims (no unlimited claim follows: the batch is full);
- with ``--ahead N``, ``limit declared, full, its backlog ahead``: a full
  limited workflow has N runs waiting, older than every plain run: the plain
  claim scans past them. Timed after the others, not in turns with them.

Claimed runs are put back to ``completed`` outside the timed part, and as
many scheduled, so the queue stays the same from one claim to the next; the
modes take turns claim by claim.
Prints the median and p90 per claim in microseconds, and each mode's median
over the baseline's.

Usage: python bench/limits.py [--claims 300] [--backlog 2000] [--ahead 10000]
"""

import argparse
import datetime as dt
import statistics
import time

try:
    from bench.common import setup, table
except ImportError:  # run as a script
    from common import setup, table

PLAIN = "bench.limits.plain"
IDLE, FULL, ROOM = "bench.limits.idle", "bench.limits.full", "bench.limits.room"
AHEAD = "bench.limits.ahead"
AHEAD_MODE = "limit declared, full, its backlog ahead"
BATCH = 4
# Runs of the limited workflows are made a day ahead: when a mode does not
# declare their limit, the plain claim still never reaches them (the plain
# backlog, refilled after each claim, is older).
LATER = dt.timedelta(days=1)
MODES = {
    "no limit declared": {},
    "limit declared, idle": {IDLE: 2},
    "limit declared, full": {FULL: 2},
    "limited runs, room": {ROOM: 1_000_000},  # room always: every claim takes the lock
}


def declare(limits: dict) -> None:
    """Register the three limited workflows, with a limit only where ``limits`` has one."""
    from everystep import registry

    for name in (IDLE, FULL, ROOM, AHEAD):

        def body():
            return None

        body.__module__, body.__qualname__ = name.rsplit(".", 1)
        registry.register(registry.Spec(name, body, "workflow", max_concurrent=limits.get(name)))


def fill(name: str, count: int, status: str = "scheduled") -> None:
    from django.utils import timezone

    from everystep.models import Workflow

    at = timezone.now() + (LATER if name != PLAIN else dt.timedelta())
    Workflow.objects.bulk_create(
        [Workflow(name=name, args=[], status=status, created_at=at) for _ in range(count)], batch_size=1000
    )


def timed_claim(limits: dict) -> tuple[float, list]:
    from everystep import claims

    declare(limits)
    began = time.perf_counter()
    runs = claims.claim_runs("bench", BATCH)
    return (time.perf_counter() - began) * 1e6, runs


def put_back(runs) -> None:
    """Complete the claimed runs and schedule as many new ones of each name."""
    from everystep.models import Workflow

    Workflow.objects.filter(id__in=[run.id for run in runs]).update(status="completed")
    for name in {run.name for run in runs}:
        fill(name, sum(run.name == name for run in runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=300, help="timed claims per mode")
    parser.add_argument("--backlog", type=int, default=2000, help="scheduled runs of a plain workflow")
    parser.add_argument(
        "--ahead", type=int, default=0,
        help="also time a claim with this many runs of a full limited workflow ahead of the plain ones",
    )
    options = parser.parse_args()
    modes = dict(MODES)
    setup("limits")
    from django.utils import timezone

    from everystep.models import Workflow

    fill(PLAIN, options.backlog)
    fill(FULL, 2, status="running")
    fill(FULL, 50)
    fill(ROOM, 50)
    fill(AHEAD, 2, status="running")
    fill(AHEAD, options.ahead)
    samples = {mode: [] for mode in modes}
    for _ in range(3):  # warm-up: connections, plans, the lock rows
        for limits in modes.values():
            put_back(timed_claim(limits)[1])
    for _ in range(options.claims):  # claim by claim, so that the machine's noise is shared
        for mode, limits in modes.items():
            micros, runs = timed_claim(limits)
            expected = ROOM if mode == "limited runs, room" else PLAIN
            assert [run.name for run in runs] == [expected] * BATCH, (mode, runs)
            samples[mode].append(micros)
            put_back(runs)
    if options.ahead:
        # Last, on its own: its backlog, older than every plain run, would be
        # claimed by the plain claim of the modes that do not declare it.
        Workflow.objects.filter(name=AHEAD, status="scheduled").update(created_at=timezone.now() - LATER)
        modes[AHEAD_MODE] = {AHEAD: 2}
        samples[AHEAD_MODE] = []
        put_back(timed_claim(modes[AHEAD_MODE])[1])  # warm-up
        for _ in range(options.claims):
            micros, runs = timed_claim(modes[AHEAD_MODE])
            assert [run.name for run in runs] == [PLAIN] * BATCH, (AHEAD_MODE, runs)
            samples[AHEAD_MODE].append(micros)
            put_back(runs)
    base = statistics.median(samples["no limit declared"])
    rows = []
    for mode in modes:
        values = sorted(samples[mode])
        p50 = statistics.median(values)
        p90 = values[int(len(values) * 0.9) - 1]
        rows.append([mode, f"{p50:.0f}", f"{p90:.0f}", f"{p50 / base:.2f}x"])
    count = options.claims
    print(f"claim of up to {BATCH} runs, {options.backlog} scheduled, {count} claims per mode")
    print(table(rows, ["mode", "p50 us", "p90 us", "p50 / no limit"]))
    Workflow.objects.all().delete()


if __name__ == "__main__":
    main()
