"""The admin UI at scale, on PostgreSQL: server time of the runs list and of a
run page, with a million runs in the table.

Loads N runs spread over 30 days with time-ordered UUIDv7 ids, two steps
each, made in SQL (``INSERT ... SELECT generate_series``), plus one completed
run of 5,000 steps; then ANALYZE. The load goes to a database of the run's
own, dropped at the end; with ``--keep`` to ``everystep_bench_ui_<N>`` (next
to the database of ``EVERYSTEP_BENCH_DATABASE_URL``), kept and reused by the
next ``--keep`` run (a million runs take a minute or two to load).

Each page is requested through Django's test client as a logged-in superuser
with ``DEBUG = False``: two warm-up requests, then the median (and max) of
``--requests`` timed ones, measured around ``client.get`` (middleware,
queries, template rendering; no network).

Usage: python bench/ui_scale.py [--runs 1000000] [--requests 20] [--keep [--reload]] [--json FILE]
"""

import argparse
import json
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import everystep_tables, median, setup, table  # noqa: E402

BIG_RUN_STEPS = 5000
DAYS = 30
NAMES = ["shop.workflows.fulfil_order", "shop.workflows.refund", "mail.workflows.send_digest",
         "billing.workflows.charge_invoice", "sync.workflows.import_catalogue"]

# One row per run: ids are UUIDv7 (48-bit millisecond timestamp, version 7, the
# variant bits, random rest), one distinct millisecond per run, oldest first.
LOAD_RUNS = """
INSERT INTO everystep_workflow
    (id, name, args, idempotency_key, status, claimed_by, result, error, created_at, completed_at)
SELECT
    (lpad(to_hex(ms), 12, '0') || '7' || substr(h, 1, 3) || substr('89ab', 1 + (i %% 4)::int, 1)
        || substr(h, 4, 15))::uuid,
    (%(names)s::text[])[1 + (i %% 5)::int],
    jsonb_build_array(jsonb_build_object('order_id', i), 'EUR'),
    CASE WHEN i %% 10 = 0 THEN 'key-' || i END,
    status,
    'worker-' || (i %% 4),
    CASE WHEN status = 'completed' THEN jsonb_build_object('ok', true, 'order_id', i) END,
    CASE WHEN status = 'failed' THEN jsonb_build_object(
            'type', 'builtins.ValueError', 'message', 'card declined for order ' || i, 'args', '[]'::jsonb)
         WHEN status = 'stopped' THEN jsonb_build_object(
            'type', 'everystep.errors.Terminal', 'message', 'out of stock', 'args', '[]'::jsonb)
         WHEN status = 'blocked' THEN jsonb_build_object(
            'type', 'everystep.errors.EffectUncertain', 'message', 'step 2 uncertain', 'args', '[]'::jsonb)
    END,
    to_timestamp(ms / 1000.0),
    to_timestamp(ms / 1000.0) + (i %% 5000) * interval '1 millisecond'
FROM (
    SELECT i, md5(i::text || random()::text) AS h,
           %(start_ms)s::bigint + (i * %(spacing_ms)s)::bigint AS ms,
           CASE WHEN i %% 50 = 0 THEN 'failed' WHEN i %% 1000 = 1 THEN 'stopped'
                WHEN i %% 20000 = 2 THEN 'blocked' ELSE 'completed' END AS status
    FROM generate_series(1, %(runs)s) AS i
) AS source
"""

LOAD_STEPS = """
INSERT INTO everystep_step (workflow_id, step_id, name, args, kwargs, status, result, error)
SELECT w.id, s::text, CASE s WHEN 1 THEN 'shop.steps.reserve' ELSE 'shop.steps.charge' END,
       w.args, '{}'::jsonb,
       CASE WHEN s = 2 AND w.status = 'failed' THEN 'failed'
            WHEN s = 2 AND w.status = 'blocked' THEN 'started' ELSE 'done' END,
       CASE WHEN s = 2 AND w.status IN ('failed', 'blocked') THEN NULL ELSE to_jsonb(s) END,
       CASE WHEN s = 2 AND w.status = 'failed' THEN w.error END
FROM everystep_workflow AS w CROSS JOIN generate_series(1, 2) AS s
WHERE w.name <> 'bench.workflows.many_steps'
ORDER BY w.id, s
"""


def loaded(cursor) -> tuple[int, str] | None:
    cursor.execute("SELECT to_regclass('bench_ui_load') IS NOT NULL")
    if not cursor.fetchone()[0]:
        return None
    cursor.execute("SELECT runs, big_run::text FROM bench_ui_load")
    return cursor.fetchone()


def load(runs: int, *, reload: bool) -> str:
    """The id of the 5,000-step run, loading everything first if needed."""
    from django.db import connection

    from bench.workflows import many_steps
    from everystep import schedule
    from everystep.models import Step, Workflow

    with connection.cursor() as cursor:
        found = loaded(cursor)
        if found and found[0] == runs and not reload:
            print(f"ui_scale: reusing {runs} loaded runs (--reload to load again)")
            return found[1]
        print(f"ui_scale: loading {runs} runs and {2 * runs} steps...")
        started = time.perf_counter()
        cursor.execute("DROP TABLE IF EXISTS bench_ui_load")
        cursor.execute(f"TRUNCATE {everystep_tables()}")
        cursor.execute("SET synchronous_commit = off")
        now_ms = int(time.time() * 1000)
        spacing = DAYS * 86_400_000 / runs
        cursor.execute(LOAD_RUNS, {"names": NAMES, "start_ms": now_ms - DAYS * 86_400_000,
                                   "spacing_ms": spacing, "runs": runs})
        cursor.execute(LOAD_STEPS)
    big = schedule(many_steps, BIG_RUN_STEPS)
    Step.objects.bulk_create(
        (Step(workflow_id=big.id, step_id=str(i + 1), name="bench.workflows.noop", args=[i], kwargs={},
              status="done", result=i) for i in range(BIG_RUN_STEPS)),
        batch_size=1000,
    )
    Workflow.objects.filter(id=big.id).update(status="completed", result=BIG_RUN_STEPS, claimed_by="bench")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE everystep_workflow")
        cursor.execute("VACUUM ANALYZE everystep_step")
        cursor.execute("CREATE TABLE bench_ui_load (runs integer NOT NULL, big_run uuid NOT NULL)")
        cursor.execute("INSERT INTO bench_ui_load VALUES (%s, %s)", [runs, big.id])
    print(f"ui_scale: loaded in {time.perf_counter() - started:.0f} s")
    return str(big.id)


def timed_get(client, url: str, requests: int) -> list[float]:
    times = []
    for i in range(requests + 2):
        start = time.perf_counter()
        response = client.get(url)
        elapsed = (time.perf_counter() - start) * 1000
        if response.status_code != 200:
            raise RuntimeError(f"GET {url} answered {response.status_code}")
        if i >= 2:  # warm-up
            times.append(elapsed)
    return times


def pages(big_run: str) -> list[tuple[str, str]]:
    from django.urls import reverse

    changelist = reverse("admin:everystep_workflow_changelist")
    return [
        ("runs list, first page", changelist),
        ("runs list, status = failed", f"{changelist}?{urlencode({'status': 'failed'})}"),
        ("runs list, argument filter",
         f"{changelist}?{urlencode({'args': json.dumps({'order_id': 777_777})})}"),
        ("run page, 5,000 steps", reverse("admin:everystep_workflow_run", args=[big_run])),
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--keep", action="store_true",
                        help="load into a database that is kept, and reuse it if already loaded")
    parser.add_argument("--reload", action="store_true", help="with --keep: load the runs again")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    setup(f"ui_{args.runs}", keep=args.keep)
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    settings.DEBUG = False
    big_run = load(args.runs, reload=args.reload)
    user, _ = get_user_model().objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    figures, rows = {}, []
    for label, url in pages(big_run):
        times = timed_get(client, url, args.requests)
        figures[label] = {"p50_ms": median(times), "max_ms": max(times)}
        rows.append([label, f"{median(times):.1f}", f"{max(times):.1f}"])
    print(f"\nUI at scale: {args.runs} runs in the table, {args.requests} requests per page "
          "(Django test client, DEBUG off)")
    print(table(rows, ["page", "p50 ms", "max ms"]))
    if args.json:
        Path(args.json).write_text(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
