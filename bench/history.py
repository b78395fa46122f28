"""Re-run from a step and fork from a step on long runs, on PostgreSQL.

Loads ``--runs`` completed runs of ``--steps`` top-level steps each, every
step with a result of ``--payload-kb`` kilobytes, in SQL (``INSERT ...
SELECT generate_series``), then ANALYZE. Per run, the middle step is the
chosen one; each operation is timed once per run (medians, and max):

- preview: ``rerun_preview`` (reads the run's step rows, no payloads);
- fork: ``fork_from_step``, which copies the half of the rows before the
  chosen step, payloads included, inside the database;
- re-run: ``rerun_from_step``, which deletes the other half.

Usage: python bench/history.py [--runs 5] [--steps 10000] [--payload-kb 1] [--json FILE]
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import median, setup, table  # noqa: E402

LOAD_RUNS = """
INSERT INTO everystep_workflow (id, name, args, status, result, created_at, completed_at)
SELECT gen_random_uuid(), 'bench.workflows.many_steps', '[]'::jsonb, 'completed', 'null'::jsonb, now(), now()
FROM generate_series(1, %(runs)s)
"""

LOAD_STEPS = """
INSERT INTO everystep_step (workflow_id, step_id, name, args, kwargs, status, result)
SELECT w.id, s::text, 'bench.workflows.noop', jsonb_build_array(s), '{}'::jsonb, 'done',
       to_jsonb(repeat('x', %(payload)s))
FROM everystep_workflow AS w CROSS JOIN generate_series(1, %(steps)s) AS s
ORDER BY w.id, s
"""


def timed(func, *args, **kwargs) -> float:
    started = time.perf_counter()
    func(*args, **kwargs)
    return (time.perf_counter() - started) * 1000


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--payload-kb", type=float, default=1)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    setup("history")
    from django.db import connection

    from everystep import history
    from everystep.models import Workflow

    with connection.cursor() as cursor:
        cursor.execute(LOAD_RUNS, {"runs": args.runs})
        cursor.execute(LOAD_STEPS, {"steps": args.steps, "payload": int(args.payload_kb * 1024)})
        cursor.execute("ANALYZE")
    chosen = str(args.steps // 2 + 1)
    times: dict[str, list[float]] = {"preview": [], "fork": [], "re-run": []}
    for run_id in Workflow.objects.values_list("id", flat=True):
        times["preview"].append(timed(history.rerun_preview, run_id, chosen))
        times["fork"].append(timed(history.fork_from_step, run_id, chosen))
        times["re-run"].append(timed(history.rerun_from_step, run_id, chosen))

    half = args.steps // 2
    rows = [
        ("preview (reads the run's rows)", f"{median(times['preview']):.1f}", f"{max(times['preview']):.1f}"),
        (f"fork (copies {half:,} rows)", f"{median(times['fork']):.1f}", f"{max(times['fork']):.1f}"),
        (f"re-run (deletes {args.steps - half:,} rows)", f"{median(times['re-run']):.1f}",
         f"{max(times['re-run']):.1f}"),
    ]
    print(f"{args.runs} runs of {args.steps:,} steps, {args.payload_kb:g} KB per result")
    print(table(rows, ["operation, from the middle step", "median ms", "max ms"]))
    if args.json:
        figures = {name: {"p50_ms": median(values), "max_ms": max(values)} for name, values in times.items()}
        Path(args.json).write_text(json.dumps(figures))


if __name__ == "__main__":
    main()
