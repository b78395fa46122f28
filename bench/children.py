"""Child runs on PostgreSQL, in one thread, side by side with what they replace.

1. ``start_child`` per call (a transaction that locks the parent, inserts the
   child and its link, then the parent's step row) next to a trivial step per
   call: a parent that starts N children, a run of N steps.
2. The end of a child whose parent waits for it (one transaction: the
   parent's lock, the child's end, the parent's wake-up) next to the end of
   the same one-step run without a parent: each run executed to its end.

Usage: python bench/children.py [--calls 200] [--runs 100] [--rounds 5] [--json FILE]
"""

import argparse
import json
import time
from pathlib import Path

try:
    from bench.common import median, setup, table
except ImportError:  # run as a script
    from common import median, setup, table

CLAIMER = "bench"


def execute(run) -> str:
    from everystep import runner
    from everystep.models import Workflow

    Workflow.objects.filter(id=run.id).update(status="running", claimed_by=CLAIMER)
    return runner.execute(Workflow.objects.get(id=run.id), CLAIMER)


def per_call(workflow, n: int) -> float:
    """Milliseconds per call of a run making ``n`` calls."""
    from everystep import schedule

    run = schedule(workflow, n)
    start = time.perf_counter()
    assert execute(run) == "completed"
    return (time.perf_counter() - start) / n * 1000


def per_end(n: int, *, with_parent: bool) -> float:
    """Milliseconds per one-step run executed to its end, each a child whose
    parent waits for it, or a run of its own."""
    from bench.child_workflows import leaf, waits_for_leaf
    from everystep import schedule
    from everystep.models import Workflow

    if with_parent:
        parents = [schedule(waits_for_leaf, i) for i in range(n)]
        for parent in parents:
            assert execute(parent) == "waiting"
        runs = list(Workflow.objects.filter(parent_link__parent_id__in=[p.id for p in parents]))
    else:
        runs = [schedule(leaf, i) for i in range(n)]
    start = time.perf_counter()
    for run in runs:
        assert execute(run) == "completed"
    elapsed = (time.perf_counter() - start) / n * 1000
    if with_parent:  # every parent was woken by its child's end
        assert Workflow.objects.filter(id__in=[p.id for p in parents], status="scheduled").count() == n
    return elapsed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    setup("children")
    from bench.child_workflows import fans_out, ticks

    ms = {"start_child": [], "step": [], "child end": [], "plain end": []}
    for _ in range(args.rounds):  # interleaved, so that machine noise hits both sides alike
        ms["start_child"].append(per_call(fans_out, args.calls))
        ms["step"].append(per_call(ticks, args.calls))
        ms["child end"].append(per_end(args.runs, with_parent=True))
        ms["plain end"].append(per_end(args.runs, with_parent=False))
    med = {k: median(v) for k, v in ms.items()}
    start_ratio = med["start_child"] / med["step"]
    end_ratio = med["child end"] / med["plain end"]
    print(f"\nChild runs: {args.calls} calls and {args.runs} runs per round, {args.rounds} rounds, medians")
    print(table(
        [
            ["start_child, per call", f"{med['start_child']:.2f} ms", "a trivial step",
             f"{med['step']:.2f} ms", f"{start_ratio:.1f}x"],
            ["a child's run, waking its parent", f"{med['child end']:.2f} ms", "the same run, no parent",
             f"{med['plain end']:.2f} ms", f"{end_ratio:.2f}x"],
        ],
        ["what", "median", "next to", "median", "ratio"],
    ))
    if args.json:
        figures = {"ms": med, "start_child_vs_step": start_ratio, "child_end_vs_plain_end": end_ratio}
        Path(args.json).write_text(json.dumps(figures))
    return med


if __name__ == "__main__":
    main()
